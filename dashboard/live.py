"""Live pushes: render the changed fragments once and send them to their groups.

Called after a transaction commits (scheduler.notify), from the web process, the scheduler
loop or an agent's heartbeat, always from sync code. The same template fragments serve the
first page render, the htmx responses and these pushes. Groups: `cluster` (node cards, totals,
queue table), `flow-<id>` (that flow only), `job-<id>` (that job only), `jobs-<user id>` /
`jobs-staff` for job list rows and `flows-<user id>` / `flows-staff` for flow list rows, so a
user's list never receives another user's jobs or flows.

1. Work out which groups a change concerns.
2. Ask which of them somebody watches (dashboard.presence: one cache round trip), so a
   scheduler cycle that touches a thousand jobs renders only the pages somebody has open.
3. Render those fragments (sync: templates and ORM).
4. Send them all in one round trip.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from channels.layers import get_channel_layer
from django.template.loader import render_to_string

from dashboard import presence, queries
from scheduler import notify
from scheduler.models import Flow, Job, Task

T = TypeVar("T")
log = logging.getLogger("berth.live")
SEND_TIMEOUT = 5.0

# Pushes run on the process's one channel-layer loop (scheduler.notify.layer_loop: the ASGI
# server's own, or one private loop thread), so every push reuses the layer's connections.
_pending: set[concurrent.futures.Future[Any]] = set()


def _run(coroutine: Coroutine[Any, Any, T], default: T) -> T:
    """Run `coroutine` on the target loop and wait for it; from a thread that is itself
    running an event loop it cannot wait, so the coroutine is only scheduled."""
    loop = notify.layer_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        _pending.add(future)
        future.add_done_callback(_pending.discard)
        return default
    try:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=SEND_TIMEOUT)
    except Exception:
        log.warning("live push did not complete", exc_info=True)
        return default


async def _send_all(layer: Any, messages: list[tuple[str, str]]) -> None:
    for group, html in messages:
        await layer.group_send(group, {"type": "html", "html": html})


def _send(messages: list[tuple[str, str]]) -> None:
    layer = get_channel_layer()
    messages = [(g, html) for g, html in messages if html.strip()]
    if layer is not None and messages:
        _run(_send_all(layer, messages), None)


def publish(jobs: Iterable[int] = (), flows: Iterable[int] = (), nodes: Iterable[int] = ()) -> None:
    if not presence.anyone():  # no live page open anywhere: no query, no render
        return
    job_ids, flow_ids, node_ids = set(jobs), set(flows), set(nodes)
    job_rows = list(
        Job.objects.filter(pk__in=job_ids).select_related("owner", "queue", "flow", "step")
    )
    flow_ids.update(job.flow_id for job in job_rows if job.flow_id)
    candidates = [f"job-{j.pk}" for j in job_rows] + [f"flow-{f}" for f in flow_ids]
    candidates += [f"jobs-{j.owner_id}" for j in job_rows] + ["jobs-staff", "cluster"]
    flow_rows = list(Flow.objects.filter(pk__in=flow_ids).select_related("owner"))
    candidates += [f"flows-{f.owner_id}" for f in flow_rows] + ["flows-staff"]
    watched = presence.watched(candidates)
    messages: list[tuple[str, str]] = []

    for job in job_rows:
        if f"job-{job.pk}" in watched:
            detail = queries.job_detail(job, with_logs=False)
            messages.append((f"job-{job.pk}",
                             render_to_string("dashboard/job.html#job-live", detail)))  # fmt: skip
        row_groups = [g for g in (f"jobs-{job.owner_id}", "jobs-staff") if g in watched]
        if row_groups:
            row = render_to_string("dashboard/jobs.html#job-row", {"job": job, "oob": True})
            messages.extend((g, row) for g in row_groups)

    for flow in flow_rows:
        if f"flow-{flow.pk}" in watched:
            html = render_to_string("dashboard/flow.html#flow-live", queries.flow_detail(flow))
            messages.append((f"flow-{flow.pk}", html))
    messages.extend(_flow_list_rows(flow_rows, watched))

    if (node_ids or job_ids) and "cluster" in watched:
        node_ids.update(
            Task.objects.filter(job_id__in=job_ids)
            .exclude(node=None)
            .values_list("node_id", flat=True)
        )
        html = render_to_string("dashboard/cluster.html#cluster-live", {
            "cards": queries.node_cards(sorted(node_ids)), "summary": queries.cluster_summary(),
        })  # fmt: skip
        messages.append(("cluster", html))
    _send(messages)


def _flow_list_rows(flows: list[Flow], watched: set[str]) -> list[tuple[str, str]]:
    """The flows lists' rows (`flows-<owner id>`, `flows-staff`): a new flow appears on top."""
    listed = [f for f in flows if {f"flows-{f.owner_id}", "flows-staff"} & watched]
    queries.count_flow_jobs(listed)
    messages: list[tuple[str, str]] = []
    for flow in listed:
        row = render_to_string("dashboard/flows.html#flow-row", {"f": flow, "oob": True})
        messages.extend((g, row) for g in (f"flows-{flow.owner_id}", "flows-staff") if g in watched)
    return messages


def publish_log(task_id: int, attempt: int, offset: int, data: str) -> None:
    """Append newly uploaded output to the task's pane on its job page (`job-<id>` only) and
    to the output pane of the job's flow page (`flow-<id>` only), prefixed by job/task."""
    if not presence.anyone():  # no live page open anywhere: no query
        return
    row = (
        Task.objects.filter(pk=task_id)
        .values("job_id", "attempt", "group", "index", "job__name", "job__flow_id")
        .first()
    )
    if row is None or row["attempt"] != attempt or not data:
        return  # an old attempt's late output: its pane shows the current attempt
    job_id, flow_id = row["job_id"], row["job__flow_id"]
    watched = presence.watched([f"job-{job_id}", f"flow-{flow_id}"])
    context = {"task_id": task_id, "job_id": job_id, "data": data}
    messages: list[tuple[str, str]] = []
    if f"job-{job_id}" in watched:
        messages.append(
            (f"job-{job_id}", render_to_string("dashboard/job.html#log-append", context))
        )
    if flow_id and f"flow-{flow_id}" in watched:
        label = f"{row['job__name']}/{row['group']}-{row['index']}"
        lines = "".join(f"{label}  {line}" for line in data.splitlines(keepends=True))
        if not lines.endswith("\n"):
            lines += "\n"  # lines of different jobs must not run together
        context = {"flow_id": flow_id, "data": lines[-queries.LOG_TAIL_CHARS :]}
        messages.append(
            (f"flow-{flow_id}", render_to_string("dashboard/flow.html#flow-log-append", context))
        )
    _send(messages)
