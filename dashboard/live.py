"""Live pushes: render the changed fragments once and send them to their groups.

Called after a transaction commits (scheduler.notify), from the web process, the scheduler
loop or an agent's heartbeat. The same template fragments serve the first page render, the
htmx responses and these pushes. Groups: `cluster` (node cards, totals), `flow-<id>` (that flow
only), `job-<id>` (that job only), and `jobs-<user id>` / `jobs-staff` for job rows, so a
user's list never receives another user's jobs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string

from dashboard import queries
from scheduler.models import Flow, Job, Task

log = logging.getLogger("berth.live")


def _send(group: str, html: str) -> None:
    layer = get_channel_layer()
    if layer is None or not html.strip():
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(layer.group_send)(group, {"type": "html", "html": html})
        return
    # Called from a thread that runs an event loop: async_to_sync would raise here.
    log.warning("live push to %s skipped: called from inside an event loop", group)


def publish(jobs: Iterable[int] = (), flows: Iterable[int] = (), nodes: Iterable[int] = ()) -> None:
    job_ids, flow_ids, node_ids = set(jobs), set(flows), set(nodes)
    for job in Job.objects.filter(pk__in=job_ids).select_related("owner", "queue", "flow", "step"):
        detail = queries.job_detail(job, with_logs=False)
        _send(f"job-{job.pk}", render_to_string("dashboard/job.html#job-live", detail))
        row = render_to_string("dashboard/jobs.html#job-row", {"job": job, "oob": True})
        _send(f"jobs-{job.owner_id}", row)
        _send("jobs-staff", row)
        if job.flow_id:
            flow_ids.add(job.flow_id)

    node_ids.update(
        Task.objects.filter(job_id__in=job_ids).exclude(node=None).values_list("node_id", flat=True)
    )
    for flow in Flow.objects.filter(pk__in=flow_ids).select_related("owner"):
        _send(f"flow-{flow.pk}", render_to_string("dashboard/flow.html#flow-live",
                                                  queries.flow_detail(flow)))  # fmt: skip
    if node_ids or job_ids:
        html = render_to_string("dashboard/cluster.html#cluster-live", {
            "cards": queries.node_cards(sorted(node_ids)), "summary": queries.cluster_summary(),
            "oob": True,
        })  # fmt: skip
        _send("cluster", html)


def publish_log(task_id: int, attempt: int, offset: int, data: str) -> None:
    task = Task.objects.filter(pk=task_id).only("id", "job_id", "attempt").first()
    if task is None or task.attempt != attempt:
        return
    html = render_to_string("dashboard/job.html#log-append", {"task": task, "data": data})
    _send(f"job-{task.job_id}", html)
