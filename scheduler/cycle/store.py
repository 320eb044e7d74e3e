"""The store adapter: a cycle's decisions -> rows (the snapshot side is scheduler.cycle.snapshot).

`apply_decisions` writes a cycle's evictions, binds and pending reasons in one transaction
and a fixed number of set-based statements (scheduler/sql.py). Each job's decision is still
guarded on its own: jobs are re-checked under row locks, tasks are claimed only while still
Pending, allocations are inserted with ON CONFLICT DO NOTHING and the rows that landed are
read back, so a job whose device was taken meanwhile (the unique device constraint) is undone
alone; nothing is ever double-booked, even with two schedulers running.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from scheduler import notify
from scheduler.core.cycle import Bind, CycleResult, Evict
from scheduler.core.status import Code, Status
from scheduler.cycle import leader
from scheduler.cycle.snapshot import Loaded, load_snapshot
from scheduler.lifecycle import PREEMPTED
from scheduler.lifecycle.moves import move_jobs, move_rows
from scheduler.models import Allocation, Device, Event, Job, Node, Task
from scheduler.sql import CHUNK, chunks, insert_new, update_rows
from scheduler.states.codes import EventKind, Reason
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.names import TASK_ON_NODE, JobRequest, JobState, NodeState, TaskState
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent

__all__ = ["Applied", "Loaded", "apply_decisions", "bind_jobs", "load_snapshot"]
log = logging.getLogger("berth.store")


@dataclass
class Applied:
    placed_jobs: int = 0
    binds: int = 0
    evicted_jobs: int = 0
    stale: int = 0
    pending_updated: int = 0
    by_action: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def apply_decisions(loaded: Loaded, result: CycleResult, now: datetime | None = None) -> Applied:
    """Write a cycle's decisions in one transaction; each job's part fails alone if stale."""
    now = now or timezone.now()
    applied = Applied()
    binds_by_job: dict[int, list[Bind]] = defaultdict(list)
    for bind in result.binds:
        binds_by_job[bind.job_id].append(bind)
    with transaction.atomic():
        leader.fence()  # a leader that lost its lock while deciding writes nothing
        events: list[Event] = []
        evicted = _evict_jobs(result.evictions, events, now)
        applied.evicted_jobs = len(evicted)
        applied.stale += len(result.evictions) - len(evicted)
        placed, nodes = bind_jobs(binds_by_job, loaded, now, events)
        applied.stale += len(binds_by_job) - len(placed)
        for job_id in placed:
            binds = binds_by_job[job_id]
            applied.placed_jobs += 1
            applied.binds += len(binds)
            applied.by_action[binds[0].action] += 1
        restated = _write_pending(loaded, result, binds_by_job, events)
        applied.pending_updated = len(restated)
        events.extend(_invalid_row_events(loaded))
        Event.objects.bulk_create(events, batch_size=CHUNK)
        # Pages showing a job whose status changed update too, not only bound/evicted ones.
        notify.changed(jobs=evicted | placed | restated, nodes=nodes)
        notify.orders(jobs=evicted | placed)  # wake the agents: tasks to start or to stop
    return applied


def bind_jobs(
    binds_by_job: dict[int, list[Bind]], loaded: Loaded, now: datetime, events: list[Event]
) -> tuple[set[int], set[int]]:
    """Bind each job's tasks to their nodes and devices, all of a job or none of it.

    Returns the ids of the jobs placed and of the nodes that got tasks. A job is dropped
    (stale) when it no longer waits to run, a node is no longer Ready, a task is no longer
    Pending or one of its devices was taken since the snapshot.
    """
    if not binds_by_job:
        return set(), set()
    # Re-read node states inside the transaction: a node cordoned since the snapshot
    # takes no new task.
    ready = dict(
        Node.objects.filter(state=NodeState.READY)
        .exclude(usage__has_key="pressure")  # a full disk since the snapshot: nothing new
        .values_list("name", "pk")
    )
    waiting = _lock_waiting_jobs(binds_by_job)
    ok = {
        job_id
        for job_id in waiting
        if all(
            b.node in ready and all((b.node, i) in loaded.device_ids for i in b.devices)
            for b in binds_by_job[job_id]
        )
    }
    ok = _claim_tasks(binds_by_job, ok, ready, loaded, now)
    _record_binds(binds_by_job, ok, waiting, events, now)
    return ok, {ready[b.node] for job_id in ok for b in binds_by_job[job_id]}


def _claim_tasks(
    binds_by_job: dict[int, list[Bind]],
    ok: set[int],
    ready: dict[str, int],
    loaded: Loaded,
    now: datetime,
) -> set[int]:
    """Claim the tasks that are still Pending and their devices; a job missing one is
    dropped whole (its claimed tasks go back to Pending). Returns the jobs bound."""
    task_job = {b.task_id: job_id for job_id in ok for b in binds_by_job[job_id]}
    # The task keeps its device indices after it ends (its Allocation rows do not).
    binds = [b for job_id in ok for b in binds_by_job[job_id]]
    claimed = move_rows(
        Task, TASKS, dict.fromkeys(task_job, TaskState.PENDING), TaskEvent.ASSIGN, now,
        per_row={"node": {b.task_id: ready[b.node] for b in binds},
                 "device_indices": {b.task_id: sorted(b.devices) for b in binds}},
        guards={"state": TaskState.PENDING},
    )  # fmt: skip
    failed = {job_id for task_id, job_id in task_job.items() if task_id not in claimed}
    failed |= _allocate_devices({j: binds_by_job[j] for j in ok - failed}, loaded, now)
    if failed:
        undo = [t for t, job_id in task_job.items() if job_id in failed and t in claimed]
        move_rows(Task, TASKS, dict.fromkeys(undo, TaskState.ASSIGNED), TaskEvent.EVICT, now)
    return ok - failed


def _record_binds(
    binds_by_job: dict[int, list[Bind]],
    ok: set[int],
    waiting: dict[int, tuple[str, int | None]],
    events: list[Event],
    now: datetime,
) -> None:
    """The bound jobs' rows (through the job mover: state, message, no pending status left)
    and their events."""
    messages = {
        job_id: f"{len(binds_by_job[job_id])} tasks placed on "
        + ", ".join(sorted({b.node for b in binds_by_job[job_id]}))
        for job_id in ok
    }
    # A resumed (preempted) job waits for its tasks to start like any placed job.
    bound = {job_id: waiting[job_id] for job_id in ok}
    resumed = {j: Reason.RESUMED for j, (state, _) in bound.items() if state == JobState.SUSPENDED}
    move_jobs(bound, JobEvent.BIND, messages, now, event_reasons=resumed, events=events)
    for job_id in sorted(ok):
        events.append(
            Event(
                kind=EventKind.SCHEDULED,
                reason=binds_by_job[job_id][0].action,
                message=messages[job_id],
                job_id=job_id,
                flow_id=waiting[job_id][1],
            )
        )


def _lock_waiting_jobs(binds_by_job: dict[int, list[Bind]]) -> dict[int, tuple[str, int | None]]:
    """Lock the jobs that still wait to run: id -> (state, flow id). A cancel or suspend
    asked for since the snapshot, or a job a user suspended, drops the decision."""
    waiting: dict[int, tuple[str, int | None]] = {}
    for ids in chunks(sorted(binds_by_job)):
        rows = (
            Job.objects.select_for_update(no_key=True)
            .filter(pk__in=ids, state__in=MACHINE.sources(JobEvent.BIND))
            .exclude(requested_action__in=(JobRequest.CANCEL, JobRequest.SUSPEND))
            .order_by("id")
            .values_list("id", "state", "reason", "flow_id")
        )
        for job_id, state, reason, flow_id in rows:
            if state != JobState.SUSPENDED or reason == PREEMPTED:
                waiting[job_id] = (state, flow_id)
    return waiting


def _allocate_devices(
    binds_by_job: dict[int, list[Bind]], loaded: Loaded, now: datetime
) -> set[int]:
    """Insert every device allocation at once; returns the jobs that did not get all theirs.

    The unique whole-device index is the last guard against double-booking a whole GPU: a
    row that conflicts is skipped (ON CONFLICT DO NOTHING). Fractions share a device: with
    the devices' rows locked, a device whose shares now add up past one GPU (fractions past
    it, or a fraction beside a whole GPU) fails the jobs that wrote to it. A MIG instance is
    held by one task at most (a unique index over (device, mig)): a second row for it is
    skipped. A job missing any row is undone alone."""
    wanted = {
        (b.task_id, loaded.device_ids[(b.node, index)]): job_id
        for job_id, binds in binds_by_job.items()
        for b in binds
        for index in b.devices
    }
    if not wanted:
        return set()
    shares = _fraction_shares(loaded, set(binds_by_job))
    devices = sorted({device_id for _, device_id in wanted})
    for ids in chunks(devices):  # one writer per device until the commit
        list(Device.objects.select_for_update().filter(pk__in=ids).order_by("pk").values("pk"))
    instances = {b.task_id: b.instance for binds in binds_by_job.values() for b in binds}
    rows = [
        (device_id, task_id, shares.get(task_id, 1000), instances.get(task_id, ""), now)
        for task_id, device_id in wanted
    ]
    inserted = insert_new(Allocation, ["device", "task", "share", "mig", "created_at"], rows)
    landed = {(t, d) for d, t, *_ in inserted}
    over = set(
        Allocation.objects.filter(device_id__in=devices)
        .values("device_id")
        .annotate(held=Sum("share"))
        .filter(held__gt=1000)
        .values_list("device_id", flat=True)
    )
    landed = {(t, d) for t, d in landed if d not in over}
    failed = {job_id for pair, job_id in wanted.items() if pair not in landed}
    if failed:
        undo = [t for (t, _), job_id in wanted.items() if job_id in failed]
        Allocation.objects.filter(task_id__in=undo).delete()
        log.info("placement of jobs %s dropped: a device was taken", sorted(failed))
    return failed


def _fraction_shares(loaded: Loaded, job_ids: set[int]) -> dict[int, int]:
    """task id -> its share of a GPU in thousandths, for the fractions of these jobs."""
    return {
        task.id: task.gpu_share
        for job in loaded.snapshot.jobs
        if job.id in job_ids
        for task in job.tasks
        if task.gpu_share
    }


def _evict_jobs(evictions: list[Evict], events: list[Event], now: datetime) -> set[int]:
    """Suspend the victims that are still running and preemptible; their tasks are asked to
    stop and keep their resources until the agents confirm."""
    if not evictions:
        return set()
    by_job = {e.job_id: e for e in evictions}
    victims = {
        pk: (state, flow_id)
        for pk, state, flow_id in Job.objects.select_for_update(no_key=True)
        .filter(pk__in=sorted(by_job), state__in=MACHINE.sources(JobEvent.PREEMPT))
        .filter(preemptible=True)
        .order_by("id")
        .values_list("id", "state", "flow_id")
    }
    for job_id in set(by_job) - set(victims):
        log.info("eviction of job %s dropped: no longer running or preemptible", job_id)
    if not victims:
        return set()
    Task.objects.filter(job_id__in=list(victims), state__in=TASK_ON_NODE).update(
        kill_requested=True
    )
    messages = {
        job_id: by_job[job_id].message or f"preempted by job {by_job[job_id].preemptor_job_id}"
        for job_id in victims
    }
    why = {job_id: by_job[job_id].reason for job_id in victims}
    move_jobs(victims, JobEvent.PREEMPT, messages, now, event_reasons=why, events=events)
    return set(victims)


def _write_pending(
    loaded: Loaded, result: CycleResult, binds_by_job: dict[int, list[Bind]], events: list[Event]
) -> set[int]:
    """Save each waiting job's Status (code, message, node reasons), only where code or
    message changed (no write per job per cycle); returns the jobs written, whose pages are
    then pushed. A job skipped as invalid, or waiting in a misconfigured queue, says so.

    Start estimates and queue positions are not written here: the planner owns
    `estimated_start_at` (the core's `Status.estimated_start` is left to it)."""
    wanted = _wanted_statuses(loaded, result, binds_by_job)
    changed = {
        job_id: status
        for job_id, status in wanted.items()
        if (status.code, status.message) != loaded.pending_status.get(job_id, ("", ""))
    }
    if not changed:
        return set()
    still_waiting = _save_statuses(changed)
    for job_id, message in loaded.invalid_jobs.items():
        if job_id in still_waiting and job_id in changed:  # once, when the problem appears
            log.warning("job %s skipped: %s", job_id, message)
            events.append(
                Event(
                    kind=EventKind.JOB_INVALID,
                    reason=Reason.INVALID_JOB,
                    message=message,
                    job_id=job_id,
                    flow_id=loaded.job_flows.get(job_id),
                )
            )
    return still_waiting


def _save_statuses(changed: dict[int, Status]) -> set[int]:
    """Write each changed Status on its job. Only jobs still waiting take the update; one
    that started meanwhile keeps its state. Returns the jobs written."""
    still_waiting: set[int] = set()
    for ids in chunks(sorted(changed)):
        still_waiting.update(
            Job.objects.filter(
                pk__in=ids, state__in=(JobState.PENDING, JobState.SUSPENDED)
            ).values_list("pk", flat=True)
        )
    update_rows(
        Job,
        {j: (changed[j].code, changed[j].message, changed[j].node_reasons) for j in still_waiting},
        per_row=["pending_code", "pending_message", "pending_node_reasons"],
    )
    return still_waiting


def _wanted_statuses(
    loaded: Loaded, result: CycleResult, binds_by_job: dict[int, list[Bind]]
) -> dict[int, Status]:
    """The Status each job not placed should show: the core's, or the store's own when the
    job or its queue is a row the core could not use (SchedulerError)."""
    wanted: dict[int, Status] = {}
    queue_of = {j.id: j.queue for j in loaded.snapshot.jobs} if loaded.invalid_queues else {}
    for job_id, status in result.pending.items():
        if job_id in binds_by_job:
            continue
        bad_queue = loaded.invalid_queues.get(queue_of.get(job_id, ""))
        wanted[job_id] = Status(Code.SCHEDULER_ERROR, bad_queue) if bad_queue else status
    for job_id, message in loaded.invalid_jobs.items():
        wanted[job_id] = Status(Code.SCHEDULER_ERROR, message)
    return wanted


def _invalid_row_events(loaded: Loaded) -> list[Event]:
    """An event for each misconfigured queue or node, written only when its message is new
    (the latest event of that kind for the object differs), so no cycle repeats it."""
    events = [
        _if_new(Event(kind=EventKind.QUEUE_INVALID, reason=Reason.INVALID_CAPABILITY,
                      message=message), message__startswith=f'queue "{name}" ')
        for name, message in loaded.invalid_queues.items()
    ] + [
        _if_new(Event(kind=EventKind.NODE_INVALID, reason=Reason.INVALID_LABELS,
                      message=message, node_id=node_id), node_id=node_id)
        for node_id, message in loaded.invalid_nodes.items()
    ]  # fmt: skip
    return [e for e in events if e is not None]


def _if_new(event: Event, **same_object: Any) -> Event | None:
    """`event`, unless the latest event of its kind for the same object says the same."""
    last = (
        Event.objects.filter(kind=event.kind, **same_object)
        .order_by("-id")
        .values_list("message", flat=True)
        .first()
    )
    if last == event.message:
        return None
    log.warning("%s", event.message)
    return event
