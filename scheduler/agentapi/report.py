"""`report/`: every task the agent knows (full state), and the output of an ended task inline
when it is short. An agent sends them one at a time, so they apply in the order the agent saw
things. The server validates the whole report before changing anything, moves task rows,
releases devices of tasks the agent says have stopped, and answers with orders (tasks to start
and to kill). A repeated report changes nothing more.

A task ends on the server only once its output is held: a final report says how many bytes
of output the attempt produced, and until the server holds them the task stays Running and
the answer lists it in `awaiting_output` (the agent ships the rest and reports again).
Job states are derived from task states by the scheduler loop (scheduler/lifecycle/sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from scheduler import notify
from scheduler.agent import wire
from scheduler.agent.times import process_time
from scheduler.agent.wire import TaskReport
from scheduler.agentapi.common import ProtocolError, renew, renewal_due
from scheduler.agentapi.logs import kept_bytes, kept_many, store_chunk
from scheduler.agentapi.orders import kill_order, start_messages, to_start, wanted
from scheduler.agentapi.tasks import FINAL_REPORTS, parse_tasks
from scheduler.jobs.events import record
from scheduler.lifecycle.moves import move_row
from scheduler.models import Allocation, Event, Node, Task, TaskLog
from scheduler.ops.accounting import record_task_ends
from scheduler.sql import update_rows
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import OUT_OF_MEMORY, TASK_ON_NODE, TaskState
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent


@dataclass
class _Outcome:
    """What applying a report found: jobs that may have changed, orders for the agent."""

    changed_jobs: set[int] = field(default_factory=set)
    kill: list[wire.KillOrder] = field(default_factory=list)
    awaiting: list[wire.AwaitingOutput] = field(default_factory=list)
    reported: set[int] = field(default_factory=set)  # tasks of this node the report lists
    ended: list[Task] = field(default_factory=list)  # ended in memory, written together
    kept: dict[tuple[int, int], int] = field(default_factory=dict)  # output held, read ahead
    chunks: list[TaskLog] = field(default_factory=list)  # inline output, inserted together
    measured: dict[int, dict[str, Any]] = field(default_factory=dict)  # task id -> its usage


def apply_report(node: Node, data: object) -> dict[str, Any]:
    """Apply one full-state report from `node`'s agent; answer with orders."""
    reports, usage, _ = parse_tasks(data)  # GPU samples are kept from leases only
    now = timezone.now()
    outcome = _Outcome()
    # One live push for the whole report (its output chunks and its task moves), not one each.
    with notify.batch(), transaction.atomic():
        tasks = _lock_reported(node, reports)
        outcome.kept = kept_many(
            [(r.id, r.attempt) for r in reports if r.id in tasks and r.state in FINAL_REPORTS]
        )
        for report in reports:
            _apply_reported(node, tasks.get(report.id), report, now, outcome)
        start = _reconcile_unreported(node, tasks, now, outcome)
        # ON CONFLICT DO NOTHING: the same chunk from a concurrent retry, without a savepoint.
        TaskLog.objects.bulk_create(outcome.chunks, ignore_conflicts=True)
        _save_ended(outcome.ended, node, outcome.measured)
        was, beat, old_usage = node.state, node.last_heartbeat, node.usage
        renew(node, now)
        node.usage = usage
        if was != node.state or usage != old_usage or renewal_due(beat, now):
            # Never back in time: a lease may have renewed the node since `now` was read
            # (this row is not locked here), and agents fence against the renewal they sent.
            Node.objects.filter(pk=node.pk).update(
                last_heartbeat=Greatest(Coalesce("last_heartbeat", Value(now)), Value(now)),
                state=node.state,
                usage=node.usage,
            )
        changed_node = bool(outcome.changed_jobs) or was != node.state
        notify.changed(jobs=outcome.changed_jobs, nodes=[node.pk] if changed_node else [])
        # The locked rows hold only what a report reads of their jobs: the starts are read
        # as a lease reads them (START_FIELDS), one query whatever their number.
        start_orders = start_messages(to_start([t.pk for t in start], node), node)
    orders = wire.Orders(start_orders, outcome.kill, outcome.awaiting,
                         settings.BERTH_HEARTBEAT_INTERVAL)  # fmt: skip
    return orders.to_json()


def _lock_reported(node: Node, reports: list[TaskReport]) -> dict[int, Task]:
    """The reported tasks' rows and those of the tasks on this node, locked, in one query.
    The current attempt of a task placed on another node is not this agent's to report (a
    node token acts only for its own node): refused whole. An older attempt is a leftover of
    a task that moved on while this node was away: the agent is told to kill it."""
    tasks = {
        t.pk: t
        for t in Task.objects.select_for_update(of=("self",))
        .select_related("job__owner", "job__queue")  # for the usage records of tasks that end
        .only(*_report_fields())  # of the job, its owner and its queue what those need
        .filter(Q(pk__in=[r.id for r in reports]) | Q(node=node, state__in=TASK_ON_NODE))
        .order_by("pk")
    }
    foreign = [
        r.id
        for r in reports
        if r.id in tasks
        and tasks[r.id].node_id not in (None, node.pk)
        and tasks[r.id].attempt == r.attempt
    ]
    if foreign:
        raise ProtocolError(
            {"tasks": [f"task {i} is not assigned to node {node.name}" for i in foreign]}
        )
    return tasks


@cache
def _report_fields() -> tuple[str, ...]:
    """What a report reads: the whole task; of its job the flow (events), the owner's name
    and the queue's (usage records); not the job's forty other columns and its spec."""
    task = tuple(f.name for f in Task._meta.concrete_fields)
    return (*task, "job__flow", "job__owner__username", "job__queue__name")


def _apply_reported(
    node: Node, task: Task | None, report: TaskReport, now: Any, outcome: _Outcome
) -> None:
    if not wanted(task, report, node):
        # Unknown, stale or already over on the server: the agent must stop it.
        if report.state == wire.TaskState.RUNNING and not report.stopping:
            outcome.kill.append(kill_order(report.id, report.attempt))
        return
    assert task is not None
    outcome.reported.add(task.pk)
    if _apply_one(task, report, now, node, outcome):
        outcome.changed_jobs.add(task.job_id)
    if report.state == wire.TaskState.RUNNING and task.kill_requested and not report.stopping:
        outcome.kill.append(kill_order(task.pk, task.attempt))


def _reconcile_unreported(
    node: Node, tasks: dict[int, Task], now: Any, outcome: _Outcome
) -> list[Task]:
    """Tasks the server placed here that the report does not list: to start, to kill, or
    Lost. A Running task missing from a report is gone from the node: a task becomes Running
    only when the agent lists it (in a report or a lease), and the agent never sends a report
    that leaves out a task it has listed before the server has taken its end."""
    start: list[Task] = []
    for task in tasks.values():  # locked by _lock_reported
        if task.node_id != node.pk or task.state not in TASK_ON_NODE:
            continue
        if task.pk in outcome.reported:
            continue
        if task.state == TaskState.RUNNING:
            _finish(task, TaskState.LOST, None, "agent no longer runs it", now, outcome)
            outcome.changed_jobs.add(task.job_id)
        elif task.kill_requested:
            # Its start may be on its way to the agent in a lease answer: the agent
            # confirms it never ran (or kills it) before its devices are released.
            outcome.kill.append(kill_order(task.pk, task.attempt))
        else:
            start.append(task)
    return start


def _apply_one(task: Task, report: TaskReport, now: Any, node: Node, outcome: _Outcome) -> bool:
    """Move one task as its report says; True if its job may have changed."""
    if report.state == wire.TaskState.RUNNING:
        _remember_start(task, report)
        return _mark_running(task, now, node, report.started_at)
    kept = outcome.kept.get((task.pk, report.attempt))
    if report.output is not None and report.output[1]:  # inline
        kept = store_chunk(task, report.attempt, *report.output, contiguous=True, kept=kept,
                            pending=outcome.chunks)  # fmt: skip
    held = _held_bytes(task, report.attempt, report.output_bytes, kept)
    if held < report.output_bytes:
        # The end is known, the output not all here yet: it stays Running until it is.
        outcome.awaiting.append(
            wire.AwaitingOutput(task.pk, task.attempt, held, report.output_bytes)
        )
        return _mark_running(task, now, node, report.started_at)
    never_ran = report.state == wire.TaskState.KILLED and report.exit_code is None
    if not never_ran and (task.started_at is None or report.started_at is not None):
        task.started_at = process_time(report.started_at, now, task.assigned_at, "start")
    ended = process_time(report.ended_at, now, task.started_at or task.assigned_at, "end")
    _finish(task, FINAL_REPORTS[report.state], report.exit_code, report.message, ended, outcome)
    task.reason = report.reason
    outcome.measured[task.pk] = report.usage
    return True


def _remember_start(task: Task, report: TaskReport) -> None:
    """Keep the port the agent picked for the job's app and the GPU sharing mode it applied
    (a lease may have marked the task Running before this report came)."""
    changed = []
    if report.app_port is not None and task.app_port != report.app_port:
        task.app_port = report.app_port
        changed.append("app_port")
    if report.gpu_mode and task.gpu_mode != report.gpu_mode:
        task.gpu_mode = report.gpu_mode
        changed.append("gpu_mode")
    if changed:
        task.save(update_fields=changed)


def _mark_running(task: Task, now: Any, node: Node, started_at: float | None = None) -> bool:
    """Assigned -> Running, started when the agent says the process started (`started_at`,
    Unix seconds, bounded by scheduler/agent/times.py), else `now`."""
    if task.state != TaskState.ASSIGNED:
        return False
    move_row(task, TASKS, TaskEvent.START, now)
    task.started_at = process_time(started_at, now, task.assigned_at, "start")
    task.save(update_fields=["state", "started_at"])
    record(EventKind.TASK_STARTED, Reason.STARTED, f"{task.group}-{task.index} on {node.name}",
           job=task.job, node=node)  # fmt: skip
    return True


def _held_bytes(task: Task, attempt: int, wanted: int, kept: int | None = None) -> int:
    """Output bytes of the attempt the server holds (all of them once the log cap is hit);
    `kept` when just stored, else read."""
    if wanted == 0:
        return 0
    if kept is None:
        kept = kept_bytes(task, attempt)
    return wanted if kept >= settings.BERTH_LOG_MAX_BYTES else kept


def _finish(task: Task, state: str, exit_code: int | None, message: str, now: Any,
            outcome: _Outcome) -> None:  # fmt: skip
    """The task stopped: record how (written with the report's other ends, `_save_ended`)."""
    move_row(task, TASKS, TASKS.event_into(state), now)
    task.exit_code = exit_code
    task.message = message
    outcome.ended.append(task)


def _save_ended(ended: list[Task], node: Node,
                measured: dict[int, dict[str, Any]] | None = None) -> None:  # fmt: skip
    """Write the tasks a report ended, free their devices, account for what they used and
    record why, a few statements for all of them."""
    if not ended:
        return
    update_rows(Task, {t.pk: (t.state, t.exit_code, t.started_at, t.finished_at, t.message,
                              t.reason) for t in ended},
                per_row=["state", "exit_code", "started_at", "finished_at", "message",
                         "reason"])  # fmt: skip
    # each task's own finish time is kept
    record_task_ends(ended, timezone.now(), measured=measured or {})
    Allocation.objects.filter(task__in=[t.pk for t in ended]).delete()
    Event.objects.bulk_create(
        Event(kind=EventKind.task_ended(t.state), reason=t.state, message=_end_text(t),
              job_id=t.job_id, flow_id=t.job.flow_id, node=node)
        for t in ended
    )  # fmt: skip


def _end_text(task: Task) -> str:
    what = f"{task.group}-{task.index}"
    if task.reason == OUT_OF_MEMORY:
        return f"{what} ran out of memory: {task.message}"
    if task.state == TaskState.FAILED:
        return f"{what} exited with code {task.exit_code}"
    if task.state == TaskState.SUCCEEDED:
        return f"{what} exited with code 0"
    return f"{what}: {task.message}" if task.message else what
