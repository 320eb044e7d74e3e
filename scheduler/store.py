"""The store adapter: database rows -> a core Snapshot, and a cycle's decisions -> rows.

`load_snapshot` reads everything the core needs in a fixed number of queries (nodes, devices,
queues, jobs, tasks, allocations), never one per job. `apply_decisions` writes a cycle's
binds, evictions and pending reasons in one transaction; each job's decisions sit in their own
savepoint and are guarded by conditional updates and the unique device allocation, so a stale
decision (the job was cancelled, the node cordoned, the device taken meanwhile) fails alone and
a device is never double-booked, even with two schedulers running.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from scheduler import notify
from scheduler.core.cycle import Bind, CycleResult, Evict
from scheduler.core.model import DeviceInfo, JobInfo, NodeInfo, QueueInfo, Snapshot, TaskInfo
from scheduler.core.resources import Resources
from scheduler.events import record
from scheduler.lifecycle import PREEMPTED
from scheduler.models import Allocation, Device, Job, Node, Queue, Task
from scheduler.states import TASK_ON_NODE, JobRequest, JobState, NodeState, TaskState

log = logging.getLogger("berth.store")


class StaleDecision(Exception):
    """The world changed between snapshot and commit; this job's decision is dropped."""


@dataclass
class Loaded:
    """What the adapter remembers of a snapshot to write decisions back cheaply."""

    snapshot: Snapshot
    node_ids: dict[str, int]
    device_ids: dict[tuple[str, int], int]
    pending_reasons: dict[int, tuple[list[str], datetime | None]] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def load_snapshot(now: datetime | None = None) -> Loaded:
    """Read the cluster as the core sees it, in six queries."""
    now = now or timezone.now()
    nodes = list(Node.objects.order_by("name"))
    devices_by_node: dict[int, list[Device]] = defaultdict(list)
    for device in Device.objects.order_by("node_id", "index"):
        devices_by_node[device.node_id].append(device)
    node_name = {n.pk: n.name for n in nodes}
    node_infos = [
        NodeInfo(
            name=n.name,
            allocatable=Resources(cpu=n.cpu, memory=n.memory, gpu=len(devices_by_node[n.pk])),
            labels=dict(n.labels or {}),
            state=n.state,
            devices=[
                DeviceInfo(index=d.index, uuid=d.uuid, model=d.model, healthy=d.healthy)
                for d in devices_by_node[n.pk]
            ],
        )
        for n in nodes
    ]
    queues = [
        QueueInfo(
            name=q.name,
            weight=q.weight,
            capability=_capability(q.capability),
            reclaimable=q.reclaimable,
            priority=q.priority,
            open=q.open,
        )
        for q in Queue.objects.order_by("name")
    ]

    # Candidates: pending jobs not held, and jobs suspended by preemption (they resume by
    # themselves). Holders: running and terminating jobs, and suspended jobs whose tasks
    # are still stopping.
    wanted = Job.objects.filter(
        Q(state=JobState.PENDING, hold_reason="")
        | Q(state__in=(JobState.RUNNING, JobState.TERMINATING, JobState.SUSPENDED))
    ).exclude(requested_action=JobRequest.CANCEL)
    jobs = list(
        wanted.select_related("queue")
        .only(
            "id",
            "name",
            "queue__name",
            "owner_id",
            "priority",
            "preemptible",
            "min_available",
            "created_at",
            "walltime",
            "state",
            "reason",
            "requested_action",
            "pending_reasons",
            "estimated_start_at",
            "spec",
        )
        .order_by("id")
    )
    tasks_by_job: dict[int, list[Task]] = defaultdict(list)
    # The same job query as a subquery: one statement whatever the backlog's size.
    for task in Task.objects.filter(job__in=wanted.values("pk")).order_by(
        "job_id", "group", "index"
    ):
        tasks_by_job[task.job_id].append(task)
    devices_by_task: dict[int, list[int]] = defaultdict(list)
    for task_id, index in Allocation.objects.order_by("device__index").values_list(
        "task_id", "device__index"
    ):
        devices_by_task[task_id].append(index)

    job_infos: list[JobInfo] = []
    loaded_pending: dict[int, tuple[list[str], datetime | None]] = {}
    for job in jobs:
        tasks = tasks_by_job.get(job.pk, [])
        holding = [t for t in tasks if t.state in TASK_ON_NODE]
        state = _core_job_state(job, holding)
        if state is None:
            continue
        selectors = _selectors(job.spec)
        stopping = job.state in (JobState.TERMINATING, JobState.SUSPENDED)
        task_infos = [
            TaskInfo(
                id=t.pk,
                group=t.group,
                index=t.index,
                resources=Resources(cpu=t.cpu, memory=t.memory, gpu=t.gpu),
                node_selector=selectors.get(t.group, {}),
                state=_core_task_state(t, stopping),
                node=node_name.get(t.node_id) if t.node_id else None,
                devices=tuple(devices_by_task.get(t.pk, ())),
                started_at=_ts(t.started_at or t.assigned_at),
            )
            for t in tasks
            if t.state in TASK_ON_NODE or t.state == TaskState.PENDING
        ]
        job_infos.append(
            JobInfo(
                id=job.pk,
                name=job.name,
                queue=job.queue.name,
                owner=str(job.owner_id),
                priority=job.priority,
                preemptible=job.preemptible,
                min_available=job.min_available,
                created_at=job.created_at.timestamp(),
                walltime=float(job.walltime) if job.walltime else None,
                state=state,
                tasks=task_infos,
                suspend_requested=job.requested_action == JobRequest.SUSPEND,
            )
        )
        loaded_pending[job.pk] = (list(job.pending_reasons or []), job.estimated_start_at)

    snapshot = Snapshot(now=now.timestamp(), nodes=node_infos, queues=queues, jobs=job_infos)
    return Loaded(
        snapshot=snapshot,
        node_ids={n.name: n.pk for n in nodes},
        device_ids={
            (node_name[d.node_id], d.index): d.pk for devs in devices_by_node.values() for d in devs
        },
        pending_reasons=loaded_pending,
    )


UNLIMITED = 2**62


def _capability(data: dict[str, Any] | None) -> Resources | None:
    """A queue's capability; a dimension left out (or null) is unlimited."""
    if not data:
        return None
    return Resources(
        **{d: UNLIMITED if data.get(d) is None else int(data[d]) for d in ("cpu", "memory", "gpu")}
    )


def _selectors(spec: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {str(t.get("name")): dict(t.get("node_selector") or {}) for t in spec.get("tasks", [])}


def _core_task_state(task: Task, stopping: bool) -> str:
    """A task asked to stop keeps its resources until confirmed: the core calls it Releasing."""
    if task.state in TASK_ON_NODE:
        return "Releasing" if task.kill_requested or stopping else str(task.state)
    return "Pending"


def _core_job_state(job: Job, holding: list[Task]) -> str | None:
    """The job's state as the core knows it: Pending/Suspended (a candidate) or Running."""
    if job.state == JobState.PENDING:
        # A pending job with tasks already bound is placed; the core only adds the rest.
        return "Running" if holding else "Pending"
    if job.state == JobState.SUSPENDED:
        if holding:
            return "Running"  # still stopping: holds what its tasks hold
        # A preempted job resumes by itself; one a user suspended waits for resume.
        return "Suspended" if job.reason == PREEMPTED else None
    if job.state in (JobState.RUNNING, JobState.TERMINATING):
        return "Running" if holding else None
    return None


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
    changed_jobs: set[int] = set()
    changed_nodes: set[int] = set()
    with transaction.atomic():
        # Re-read node states inside the transaction: a node cordoned since the snapshot
        # takes no new task.
        ready = dict(Node.objects.filter(state=NodeState.READY).values_list("name", "pk"))
        for evict in result.evictions:
            try:
                with transaction.atomic():
                    _evict(evict, now)
                applied.evicted_jobs += 1
                changed_jobs.add(evict.job_id)
            except StaleDecision as exc:
                applied.stale += 1
                log.info("eviction of job %s dropped: %s", evict.job_id, exc)
        for job_id, binds in binds_by_job.items():
            try:
                with transaction.atomic():
                    _bind_job(job_id, binds, loaded, ready, now)
            except (StaleDecision, IntegrityError) as exc:
                applied.stale += 1
                log.info("placement of job %s dropped: %s", job_id, exc)
                continue
            applied.placed_jobs += 1
            applied.binds += len(binds)
            applied.by_action[binds[0].action] += 1
            changed_jobs.add(job_id)
            changed_nodes.update(ready[b.node] for b in binds)
        applied.pending_updated = _write_pending(loaded, result, binds_by_job, now)
        notify.changed(jobs=changed_jobs, nodes=changed_nodes)
        notify.orders(jobs=changed_jobs)  # wake the agents: tasks to start or to stop
    return applied


def _bind_job(
    job_id: int, binds: list[Bind], loaded: Loaded, ready: dict[str, int], now: datetime
) -> None:
    job = (
        Job.objects.select_for_update()
        .filter(pk=job_id, state__in=(JobState.PENDING, JobState.SUSPENDED, JobState.RUNNING))
        .exclude(requested_action__in=(JobRequest.CANCEL, JobRequest.SUSPEND))
        .first()
    )
    if job is None or (job.state == JobState.SUSPENDED and job.reason != PREEMPTED):
        raise StaleDecision("job is no longer waiting to run")
    allocations = []
    for bind in binds:
        node_id = ready.get(bind.node)
        if node_id is None:
            raise StaleDecision(f"node {bind.node} is no longer Ready")
        claimed = Task.objects.filter(
            pk=bind.task_id, job_id=job_id, state=TaskState.PENDING
        ).update(state=TaskState.ASSIGNED, node_id=node_id, assigned_at=now, kill_requested=False)
        if claimed != 1:
            raise StaleDecision(f"task {bind.task_id} is no longer pending")
        for index in bind.devices:
            device_id = loaded.device_ids.get((bind.node, index))
            if device_id is None:
                raise StaleDecision(f"device {bind.node}/{index} is gone")
            allocations.append(Allocation(device_id=device_id, task_id=bind.task_id))
    # The unique device constraint is the last guard against double-booking.
    Allocation.objects.bulk_create(allocations)
    nodes = sorted({b.node for b in binds})
    message = f"{len(binds)} tasks placed on {', '.join(nodes)}"
    if job.state == JobState.SUSPENDED:
        record("JobStateChanged", "Resumed", "Suspended -> Pending: resources returned", job=job)
        job.state = JobState.PENDING
    job.reason = "Scheduled"
    job.message = message
    job.pending_reasons = []
    job.estimated_start_at = None
    job.save(update_fields=["state", "reason", "message", "pending_reasons", "estimated_start_at"])
    record("Scheduled", binds[0].action, message, job=job)


def _evict(evict: Evict, now: datetime) -> None:
    job = (
        Job.objects.select_for_update()
        .filter(pk=evict.job_id, state__in=(JobState.PENDING, JobState.RUNNING), preemptible=True)
        .first()
    )
    if job is None:
        raise StaleDecision("victim is no longer running or preemptible")
    Task.objects.filter(job=job, state__in=TASK_ON_NODE).update(kill_requested=True)
    old = job.state
    job.state = JobState.SUSPENDED
    job.reason = PREEMPTED
    job.message = evict.message or f"preempted by job {evict.preemptor_job_id}"
    job.save(update_fields=["state", "reason", "message"])
    record("JobStateChanged", evict.reason, f"{old} -> Suspended: {job.message}", job=job)


def _write_pending(
    loaded: Loaded, result: CycleResult, binds_by_job: dict[int, list[Bind]], now: datetime
) -> int:
    """Save why each job still waits, only where that changed (no write per job per cycle)."""
    changed = []
    for job_id, info in result.pending.items():
        if job_id in binds_by_job:
            continue
        reasons = [info.message or info.reason]
        eta = (
            datetime.fromtimestamp(info.estimated_start, tz=timezone.get_current_timezone())
            if info.estimated_start is not None
            else None
        )
        old_reasons, old_eta = loaded.pending_reasons.get(job_id, ([], None))
        if reasons == old_reasons and _same_time(eta, old_eta):
            continue
        changed.append(Job(pk=job_id, pending_reasons=reasons, estimated_start_at=eta))
    # Only jobs still waiting take the update; one that started meanwhile keeps its state.
    if changed:
        waiting = set(
            Job.objects.filter(
                pk__in=[j.pk for j in changed], state__in=(JobState.PENDING, JobState.SUSPENDED)
            ).values_list("pk", flat=True)
        )
        Job.objects.bulk_update(
            [j for j in changed if j.pk in waiting],
            ["pending_reasons", "estimated_start_at"],
            batch_size=500,
        )
        return len(waiting)
    return 0


def _same_time(a: datetime | None, b: datetime | None) -> bool:
    if a is None or b is None:
        return a is b
    # Estimates move by fractions of a second every cycle; only a real change is written.
    return abs((a - b).total_seconds()) < 30
