"""`lease/`: renewals keep the node alive and deliver orders; the web view holds one open
until there are orders for the node (scheduler.notify wakes it). A lease changes a task row in
one way only: an Assigned task it lists as Running has started (so a start costs no report).
An old lease body can never undo a newer report."""

from __future__ import annotations

import random
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler import notify
from scheduler.agent import wire
from scheduler.agent.times import process_time
from scheduler.agent.wire import TaskReport
from scheduler.agentapi.common import ProtocolError, renew, renewal_due
from scheduler.agentapi.orders import (
    TaskRow,
    kill_order,
    start_messages,
    to_start,
    wanted,
)
from scheduler.agentapi.tasks import parse_tasks
from scheduler.jobs import terminals
from scheduler.lifecycle.moves import move_row
from scheduler.models import Event, Node, Task, hash_token
from scheduler.ops import gpu_history, gpu_idle
from scheduler.sql import lease_rows, row_by, update_rows
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import TaskState
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent

LEASE_JITTER = 0.25  # a lease is held between 1 and 1.25 leases, so renewals spread out


def lease_seconds() -> float:
    """How long a lease request may be held while there is no work: renewals at rest come
    no more often than BERTH_HEARTBEAT_INTERVAL."""
    interval = float(settings.BERTH_HEARTBEAT_INTERVAL)
    return interval * (1.0 + LEASE_JITTER * random.random())


def renew_lease(token: str, data: object) -> tuple[Node, list[TaskReport], dict[str, Any]]:
    """Authenticate, confirm the starts the body lists, renew the node's lease, keep its GPU
    samples and read its orders (one short transaction; a malformed body is refused whole
    before it)."""
    reports, _, samples = parse_tasks(data)
    recent = {r.id: r.gpu_utilization for r in reports
              if r.gpu_utilization is not None or r.gpu_unmeasured}  # fmt: skip
    token_hash = hash_token(token) if token else ""
    with transaction.atomic():
        now = timezone.now()
        started = _confirm_started(token_hash, reports, now)  # task rows locked first
        node = row_by(Node, "token_hash", token_hash, lock=True)
        if node is None or not token:
            raise ProtocolError({"detail": ["unknown node token; register again"]}, status=401)
        was, beat, sampled = node.state, node.last_heartbeat, node.gpu_sampled_at
        gpu_history.record_samples(node, samples, now)
        renew(node, now)
        if sampled != node.gpu_sampled_at or was != node.state or renewal_due(beat, now):
            node.save(update_fields=["last_heartbeat", "state", "gpu_sampled_at"])
        Event.objects.bulk_create(
            Event(kind=EventKind.TASK_STARTED, reason=Reason.STARTED, job_id=t.job_id,
                  flow_id=t.job.flow_id, node=node, message=f"{t.group}-{t.index} on {node.name}")
            for t in started
        )  # fmt: skip
        changed = bool(started) or was != node.state
        notify.changed(jobs={t.job_id for t in started}, nodes=[node.pk] if changed else [])
    # After the lease's transaction, which locks the node's row after its tasks' rows: task
    # rows are written here only when one goes idle or busy, each statement on its own.
    gpu_idle.observe(node, recent, now)
    handling = data.get("terminals") if isinstance(data, dict) else None
    return node, reports, lease_orders(node, reports, handling)


def _confirm_started(token_hash: str, reports: list[TaskReport], now: Any) -> list[Task]:
    """Assigned tasks of this node that the body lists as Running: they started. The one
    change a lease makes to a task row (Assigned -> Running, never back), so that an agent
    needs no report of its own to say a task started. Locks those rows first, in the same
    order as a report does (tasks, then the node)."""
    running = {r.id: r for r in reports if r.state == wire.TaskState.RUNNING}
    if not running or not token_hash:
        return []
    candidates = (
        Task.objects.select_for_update(of=("self",))
        .select_related("job")
        .only("attempt", "state", "started_at", "assigned_at", "group", "index", "job__flow")
        .filter(pk__in=running, state=TaskState.ASSIGNED, node__token_hash=token_hash)
    )
    started = [task for task in candidates if task.attempt == running[task.pk].attempt]
    for task in started:
        move_row(task, TASKS, TaskEvent.START, now)  # saved with the others below
        # when the agent says the process started, bounded
        task.started_at = process_time(running[task.pk].started_at, now, task.assigned_at, "start")
    # The app's port (or none) and the GPU sharing mode of this attempt: never those of an
    # earlier attempt.
    update_rows(Task, {t.pk: (t.state, t.started_at, running[t.pk].app_port,
                              running[t.pk].gpu_mode) for t in started},
                per_row=["state", "started_at", "app_port", "gpu_mode"])  # fmt: skip
    return started


def lease_orders(node: Node, reports: list[TaskReport], handling: object = None) -> dict[str, Any]:
    """Orders for the agent whose tasks are `reports`: tasks placed here it does not know
    yet, tasks it runs that must stop, and terminal sessions to open in them (`handling`: the
    sessions its lease says it has open; scheduler/terminals.py). The tasks are read as plain
    rows; only those to start are loaded as models, with what a start order says of their
    jobs."""
    known = {(r.id, r.attempt) for r in reports}
    rows = {row[0]: TaskRow(*row) for row in lease_rows(node.pk, [r.id for r in reports])}
    kill = []
    for report in reports:
        task = rows.get(report.id)
        if report.state != wire.TaskState.RUNNING or report.stopping:
            continue
        if (
            task is not None
            and task.node_id not in (None, node.pk)
            and (task.attempt == report.attempt)
        ):
            continue  # not this node's to report; its report will be refused
        if not wanted(task, report, node) or (task is not None and task.kill_requested):
            kill.append(kill_order(report.id, report.attempt))
    start: list[int] = []
    for task in rows.values():
        if task.node_id != node.pk or task.state != TaskState.ASSIGNED:
            continue
        if (task.pk, task.attempt) in known:
            continue
        if task.kill_requested:
            kill.append(kill_order(task.pk, task.attempt))
        else:
            start.append(task.pk)
    orders = wire.Orders(start_messages(to_start(start, node), node), kill,
                         lease_seconds=settings.BERTH_HEARTBEAT_INTERVAL)  # fmt: skip
    answer = orders.to_json()
    opening = terminals.terminal_orders(node, handling)
    if opening:
        answer["terminals"] = opening
    return answer
