"""The store adapter: database rows -> a core Snapshot, and a cycle's decisions -> rows.

`load_snapshot` reads everything the core needs in six queries (nodes, devices, queues, jobs,
tasks, allocations) as plain tuples, never one query per job. A row the core cannot use (a
queue capability of the wrong shape, a job spec that is not a spec, node labels that are not
labels) harms only itself: it is left out or made inert, and the reason is written once as an
event and, for jobs, as the job's pending reason.

`apply_decisions` writes a cycle's evictions, binds and pending reasons in one transaction and
a fixed number of set-based statements. Each job's decision is still guarded on its own: jobs
and tasks are re-checked under row locks, allocations are inserted with ON CONFLICT DO NOTHING
and read back, and a job whose device was taken meanwhile (the unique device constraint) is
dropped alone; nothing is ever double-booked, even with two schedulers running.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Case, Q, TextField, Value, When
from django.utils import timezone

from scheduler import notify
from scheduler.core.cycle import Bind, CycleResult, Evict
from scheduler.core.model import DeviceInfo, JobInfo, NodeInfo, QueueInfo, Snapshot, TaskInfo
from scheduler.core.resources import DIMENSIONS, Resources
from scheduler.lifecycle import PREEMPTED
from scheduler.models import Allocation, Device, Event, Job, Node, Queue, Task
from scheduler.states import TASK_ON_NODE, JobRequest, JobState, NodeState, TaskState

log = logging.getLogger("berth.store")
T = TypeVar("T")
CHUNK = 1000  # ids per IN list / CASE: well inside every backend's parameter limit
UNLIMITED = 2**62
INVALID_NODE = "Invalid"  # a snapshot-only node state: takes no new task, keeps what it holds


@dataclass
class Loaded:
    """What the adapter remembers of a snapshot to write decisions back cheaply."""

    snapshot: Snapshot
    node_ids: dict[str, int]
    device_ids: dict[tuple[str, int], int]
    pending_reasons: dict[int, tuple[list[str], datetime | None]] = field(default_factory=dict)
    # Rows the core could not use, with the reason: queue name / job id / node id -> message.
    invalid_queues: dict[str, str] = field(default_factory=dict)
    invalid_jobs: dict[int, str] = field(default_factory=dict)
    invalid_nodes: dict[int, str] = field(default_factory=dict)
    job_flows: dict[int, int | None] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _chunks(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# --- loading --------------------------------------------------------------------------------


def load_snapshot(now: datetime | None = None) -> Loaded:
    """Read the cluster as the core sees it, in six queries whatever the backlog's size."""
    now = now or timezone.now()
    loaded = Loaded(
        snapshot=Snapshot(now=now.timestamp(), nodes=[], queues=[], jobs=[]),
        node_ids={},
        device_ids={},
    )
    node_name = _load_nodes(loaded)
    queue_name = _load_queues(loaded)

    # Candidates: pending jobs not held, and jobs suspended by preemption (they resume by
    # themselves). Holders: running and terminating jobs, and suspended jobs whose tasks
    # are still stopping.
    wanted = Job.objects.filter(
        Q(state=JobState.PENDING, hold_reason="")
        | Q(state__in=(JobState.RUNNING, JobState.TERMINATING, JobState.SUSPENDED))
    ).exclude(requested_action=JobRequest.CANCEL)
    jobs = wanted.order_by("id").values_list(
        "id",
        "name",
        "queue_id",
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
        "flow_id",
        "spec__tasks",
    )
    tasks_by_job: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    # The same job query as a subquery: one statement whatever the backlog's size. Tasks that
    # ended (Succeeded, Killed, ...) matter to nothing here.
    task_rows = (
        Task.objects.filter(job__in=wanted.values("pk"))
        .filter(state__in=(TaskState.PENDING, *TASK_ON_NODE))
        .order_by("job_id", "group", "index")
        .values_list(
            "id",
            "job_id",
            "group",
            "index",
            "cpu",
            "memory",
            "gpu",
            "state",
            "node_id",
            "kill_requested",
            "started_at",
            "assigned_at",
        )
    )
    for row in task_rows:
        tasks_by_job[row[1]].append(row)
    device_index = {pk: index for (_, index), pk in loaded.device_ids.items()}
    devices_by_task: dict[int, list[int]] = defaultdict(list)
    for task_id, device_id in Allocation.objects.values_list("task_id", "device_id"):
        if device_id in device_index:
            devices_by_task[task_id].append(device_index[device_id])

    for row in jobs:
        job_id = row[0]
        tasks = tasks_by_job.get(job_id, [])
        try:
            selectors: dict[str, dict[str, str]] | None = _selectors(row[15])
        except (TypeError, ValueError, AttributeError) as exc:
            # One job whose stored spec makes no sense places nothing new; what it already
            # holds still counts, and everyone else goes on.
            loaded.invalid_jobs[job_id] = f"cannot be scheduled: its stored spec is invalid ({exc})"
            selectors = None
        try:
            info = _job_info(row, tasks, selectors, queue_name, node_name, devices_by_task)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            loaded.invalid_jobs[job_id] = f"cannot be scheduled: {type(exc).__name__}: {exc}"
            info = None
        loaded.job_flows[job_id] = row[14]
        reasons = row[12] if isinstance(row[12], list) else []
        loaded.pending_reasons[job_id] = ([str(r) for r in reasons], row[13])
        if info is not None:
            loaded.snapshot.jobs.append(info)
    return loaded


def _load_nodes(loaded: Loaded) -> dict[int, str]:
    nodes = list(
        Node.objects.order_by("name").values_list("id", "name", "cpu", "memory", "labels", "state")
    )
    devices_by_node: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in Device.objects.order_by("node_id", "index").values_list(
        "id", "node_id", "index", "uuid", "model", "healthy"
    ):
        devices_by_node[row[1]].append(row)
    node_name = {pk: name for pk, name, *_ in nodes}
    for pk, name, cpu, memory, labels, state in nodes:
        devices = devices_by_node[pk]
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            loaded.invalid_nodes[pk] = f"node {name}: labels must map names to strings"
            labels, state = {}, INVALID_NODE
        loaded.snapshot.nodes.append(
            NodeInfo(
                name=name,
                allocatable=Resources(cpu=cpu, memory=memory, gpu=len(devices)),
                labels=dict(labels),
                state=state,
                devices=[
                    DeviceInfo(index=d[2], uuid=d[3], model=d[4], healthy=d[5]) for d in devices
                ],
            )
        )
        loaded.node_ids[name] = pk
        for d in devices:
            loaded.device_ids[(name, d[2])] = d[0]
    return node_name


def _load_queues(loaded: Loaded) -> dict[int, str]:
    queue_name = {}
    for pk, name, weight, capability, reclaimable, priority, is_open in Queue.objects.order_by(
        "name"
    ).values_list("id", "name", "weight", "capability", "reclaimable", "priority", "open"):
        queue_name[pk] = name
        try:
            limit = _capability(capability)
        except ValueError as exc:
            # A queue the core cannot read admits nothing (its running jobs still count), and
            # its waiting jobs say why; other queues are untouched.
            loaded.invalid_queues[name] = f'queue "{name}" is misconfigured: capability {exc}'
            limit, is_open = None, False
        loaded.snapshot.queues.append(
            QueueInfo(
                name=name,
                weight=weight,
                capability=limit,
                reclaimable=reclaimable,
                priority=priority,
                open=is_open,
            )
        )
    return queue_name


def _capability(data: Any) -> Resources | None:
    """A queue's capability; a dimension left out (or null) is unlimited. Anything else than
    {"cpu": millicores, "memory": bytes, "gpu": count} with whole numbers is refused."""
    if data is None or data == {}:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"must be a mapping of {', '.join(DIMENSIONS)}, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in DIMENSIONS)
    if unknown:
        raise ValueError(f"has unknown keys: {', '.join(unknown)}")
    values = {}
    for dim in DIMENSIONS:
        raw = data.get(dim)
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 0):
            raise ValueError(f"{dim} must be a whole number >= 0 or null, got {raw!r:.40}")
        values[dim] = UNLIMITED if raw is None else raw
    return Resources(**values)


def _selectors(spec_tasks: Any) -> dict[str, dict[str, str]]:
    """Each task group's node selector, from the `tasks` list of the job's stored spec."""
    if not isinstance(spec_tasks, list) or not spec_tasks:
        raise TypeError("tasks must be a non-empty list")
    selectors = {}
    for task in spec_tasks:
        if not isinstance(task, dict):
            raise TypeError("each task must be a mapping")
        selector = task.get("node_selector") or {}
        if not isinstance(selector, dict):
            raise TypeError(f"node_selector of task {task.get('name')!r:.40} must be a mapping")
        selectors[str(task.get("name"))] = {str(k): str(v) for k, v in selector.items()}
    return selectors


def _job_info(
    row: tuple[Any, ...],
    tasks: list[tuple[Any, ...]],
    selectors: dict[str, dict[str, str]] | None,
    queue_name: dict[int, str],
    node_name: dict[int, str],
    devices_by_task: dict[int, list[int]],
) -> JobInfo | None:
    (
        job_id,
        name,
        queue_id,
        owner_id,
        priority,
        preemptible,
        min_available,
        created_at,
        walltime,
        state,
        reason,
        requested_action,
        *_,
    ) = row
    holding = any(t[7] in TASK_ON_NODE for t in tasks)
    core_state = _core_job_state(state, reason, holding)
    if selectors is None:  # invalid spec: keep only what the job already holds
        if not holding:
            return None
        tasks = [t for t in tasks if t[7] in TASK_ON_NODE]
    if core_state is None:
        return None
    stopping = state in (JobState.TERMINATING, JobState.SUSPENDED)
    task_infos = [
        TaskInfo(
            id=task_id,
            group=group,
            index=index,
            resources=Resources(cpu=cpu, memory=memory, gpu=gpu),
            node_selector=(selectors or {}).get(group, {}),
            state=_core_task_state(task_state, kill_requested, stopping),
            node=node_name.get(node_id) if node_id else None,
            devices=tuple(devices_by_task.get(task_id, ())),
            started_at=_ts(started_at or assigned_at),
        )
        for (
            task_id,
            _,
            group,
            index,
            cpu,
            memory,
            gpu,
            task_state,
            node_id,
            kill_requested,
            started_at,
            assigned_at,
        ) in tasks
    ]
    return JobInfo(
        id=job_id,
        name=name,
        queue=queue_name[queue_id],
        owner=str(owner_id),
        priority=priority,
        preemptible=preemptible,
        min_available=min_available,
        created_at=created_at.timestamp(),
        walltime=float(walltime) if walltime else None,
        state=core_state,
        tasks=task_infos,
        suspend_requested=requested_action == JobRequest.SUSPEND,
    )


def _core_task_state(state: str, kill_requested: bool, stopping: bool) -> str:
    """A task asked to stop keeps its resources until confirmed: the core calls it Releasing."""
    if state in TASK_ON_NODE:
        return "Releasing" if kill_requested or stopping else str(state)
    return "Pending"


def _core_job_state(state: str, reason: str, holding: bool) -> str | None:
    """The job's state as the core knows it: Pending/Suspended (a candidate) or Running."""
    if state == JobState.PENDING:
        # A pending job with tasks already bound is placed; the core only adds the rest.
        return "Running" if holding else "Pending"
    if state == JobState.SUSPENDED:
        if holding:
            return "Running"  # still stopping: holds what its tasks hold
        # A preempted job resumes by itself; one a user suspended waits for resume.
        return "Suspended" if reason == PREEMPTED else None
    if state in (JobState.RUNNING, JobState.TERMINATING):
        return "Running" if holding else None
    return None


# --- writing decisions ----------------------------------------------------------------------


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
        events: list[Event] = []
        evicted = _evict_jobs(result.evictions, events)
        applied.evicted_jobs = len(evicted)
        applied.stale += len(result.evictions) - len(evicted)
        placed, nodes = bind_jobs(binds_by_job, loaded, now, events)
        applied.stale += len(binds_by_job) - len(placed)
        for job_id in placed:
            binds = binds_by_job[job_id]
            applied.placed_jobs += 1
            applied.binds += len(binds)
            applied.by_action[binds[0].action] += 1
        applied.pending_updated = _write_pending(loaded, result, binds_by_job, events)
        events.extend(_invalid_row_events(loaded))
        Event.objects.bulk_create(events, batch_size=CHUNK)
        notify.changed(jobs=evicted | placed, nodes=nodes)
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
    ready = dict(Node.objects.filter(state=NodeState.READY).values_list("name", "pk"))
    waiting: dict[int, tuple[str, int | None]] = {}
    for ids in _chunks(sorted(binds_by_job)):
        rows = (
            Job.objects.select_for_update()
            .filter(pk__in=ids, state__in=(JobState.PENDING, JobState.SUSPENDED, JobState.RUNNING))
            .exclude(requested_action__in=(JobRequest.CANCEL, JobRequest.SUSPEND))
            .order_by("id")
            .values_list("id", "state", "reason", "flow_id")
        )
        for job_id, state, reason, flow_id in rows:
            if state != JobState.SUSPENDED or reason == PREEMPTED:
                waiting[job_id] = (state, flow_id)
    ok = {
        job_id
        for job_id in waiting
        if all(
            b.node in ready and all((b.node, i) in loaded.device_ids for i in b.devices)
            for b in binds_by_job[job_id]
        )
    }
    task_job = {b.task_id: job_id for job_id in ok for b in binds_by_job[job_id]}
    pending: set[int] = set()
    for ids in _chunks(sorted(task_job)):
        pending.update(
            Task.objects.select_for_update()
            .filter(pk__in=ids, state=TaskState.PENDING)
            .order_by("id")
            .values_list("id", flat=True)
        )
    ok -= {job_id for task_id, job_id in task_job.items() if task_id not in pending}
    ok -= _allocate_devices({j: binds_by_job[j] for j in ok}, loaded)

    binds = [b for job_id in sorted(ok) for b in binds_by_job[job_id]]
    for batch in _chunks(binds):
        Task.objects.filter(pk__in=[b.task_id for b in batch]).update(
            state=TaskState.ASSIGNED,
            node_id=Case(
                *[When(pk=b.task_id, then=Value(ready[b.node])) for b in batch],
                output_field=BigIntegerField(),
            ),
            assigned_at=now,
            kill_requested=False,
        )
    messages = {
        job_id: f"{len(binds_by_job[job_id])} tasks placed on "
        + ", ".join(sorted({b.node for b in binds_by_job[job_id]}))
        for job_id in ok
    }
    resumed = sorted(j for j in ok if waiting[j][0] == JobState.SUSPENDED)
    for ids in _chunks(resumed):
        # A resumed (preempted) job waits for its tasks to start like any placed job.
        Job.objects.filter(pk__in=ids).update(state=JobState.PENDING)
    for ids in _chunks(sorted(ok)):
        Job.objects.filter(pk__in=ids).update(
            reason="Scheduled",
            message=Case(
                *[When(pk=j, then=Value(messages[j])) for j in ids], output_field=TextField()
            ),
            pending_reasons=[],
            estimated_start_at=None,
        )
    for job_id in sorted(ok):
        state, flow_id = waiting[job_id]
        if state == JobState.SUSPENDED:
            events.append(
                Event(
                    kind="JobStateChanged",
                    reason="Resumed",
                    job_id=job_id,
                    flow_id=flow_id,
                    message="Suspended -> Pending: resources returned",
                )
            )
        events.append(
            Event(
                kind="Scheduled",
                reason=binds_by_job[job_id][0].action,
                message=messages[job_id],
                job_id=job_id,
                flow_id=flow_id,
            )
        )
    return ok, {ready[b.node] for b in binds}


def _allocate_devices(binds_by_job: dict[int, list[Bind]], loaded: Loaded) -> set[int]:
    """Insert every device allocation at once; returns the jobs that did not get all theirs.

    The unique device constraint is the last guard against double-booking: rows that conflict
    are skipped (ON CONFLICT DO NOTHING), read back, and a job missing any is undone alone.
    """
    wanted = {
        (b.task_id, loaded.device_ids[(b.node, index)]): job_id
        for job_id, binds in binds_by_job.items()
        for b in binds
        for index in b.devices
    }
    if not wanted:
        return set()
    try:
        with transaction.atomic():
            Allocation.objects.bulk_create(
                [Allocation(task_id=t, device_id=d) for t, d in wanted],
                ignore_conflicts=True,
                batch_size=CHUNK,
            )
    except IntegrityError:
        # A device deleted meanwhile (its node removed): fall back to one job at a time.
        return _allocate_one_by_one(wanted)
    landed: set[tuple[int, int]] = set()
    task_ids = sorted({t for t, _ in wanted})
    for ids in _chunks(task_ids):
        landed.update(
            Allocation.objects.filter(task_id__in=ids).values_list("task_id", "device_id")
        )
    failed = {job_id for pair, job_id in wanted.items() if pair not in landed}
    if failed:
        undo = [t for (t, _), job_id in wanted.items() if job_id in failed]
        Allocation.objects.filter(task_id__in=undo).delete()
        log.info("placement of jobs %s dropped: a device was taken", sorted(failed))
    return failed


def _allocate_one_by_one(wanted: dict[tuple[int, int], int]) -> set[int]:
    by_job: dict[int, list[Allocation]] = defaultdict(list)
    for (task_id, device_id), job_id in wanted.items():
        by_job[job_id].append(Allocation(task_id=task_id, device_id=device_id))
    failed = set()
    for job_id, rows in by_job.items():
        try:
            with transaction.atomic():
                Allocation.objects.bulk_create(rows)
        except IntegrityError as exc:
            failed.add(job_id)
            log.info("placement of job %s dropped: %s", job_id, exc)
    return failed


def _evict_jobs(evictions: list[Evict], events: list[Event]) -> set[int]:
    """Suspend the victims that are still running and preemptible; their tasks are asked to
    stop and keep their resources until the agents confirm."""
    if not evictions:
        return set()
    by_job = {e.job_id: e for e in evictions}
    victims = list(
        Job.objects.select_for_update()
        .filter(
            pk__in=sorted(by_job), state__in=(JobState.PENDING, JobState.RUNNING), preemptible=True
        )
        .order_by("id")
        .values_list("id", "state", "flow_id")
    )
    for job_id in set(by_job) - {v[0] for v in victims}:
        log.info("eviction of job %s dropped: no longer running or preemptible", job_id)
    if not victims:
        return set()
    ids = [v[0] for v in victims]
    Task.objects.filter(job_id__in=ids, state__in=TASK_ON_NODE).update(kill_requested=True)
    messages = {
        job_id: by_job[job_id].message or f"preempted by job {by_job[job_id].preemptor_job_id}"
        for job_id in ids
    }
    Job.objects.filter(pk__in=ids).update(
        state=JobState.SUSPENDED,
        reason=PREEMPTED,
        message=Case(*[When(pk=j, then=Value(messages[j])) for j in ids], output_field=TextField()),
    )
    for job_id, old, flow_id in victims:
        events.append(
            Event(
                kind="JobStateChanged",
                reason=by_job[job_id].reason,
                job_id=job_id,
                flow_id=flow_id,
                message=f"{old} -> Suspended: {messages[job_id]}",
            )
        )
    return set(ids)


def _write_pending(
    loaded: Loaded, result: CycleResult, binds_by_job: dict[int, list[Bind]], events: list[Event]
) -> int:
    """Save why each job still waits, only where that changed (no write per job per cycle).
    A job skipped as invalid, or waiting in a misconfigured queue, says so."""
    wanted: dict[int, tuple[list[str], datetime | None]] = {}
    queue_of = {j.id: j.queue for j in loaded.snapshot.jobs} if loaded.invalid_queues else {}
    for job_id, info in result.pending.items():
        if job_id in binds_by_job:
            continue
        message = loaded.invalid_queues.get(queue_of.get(job_id, ""), info.message or info.reason)
        wanted[job_id] = ([message], _from_timestamp(info.estimated_start))
    for job_id, message in loaded.invalid_jobs.items():
        wanted[job_id] = ([message], None)
    changed = {}
    for job_id, (reasons, eta) in wanted.items():
        old_reasons, old_eta = loaded.pending_reasons.get(job_id, ([], None))
        if reasons != old_reasons or not _same_time(eta, old_eta):
            changed[job_id] = (reasons, eta)
    if not changed:
        return 0
    # Only jobs still waiting take the update; one that started meanwhile keeps its state.
    still_waiting: set[int] = set()
    for ids in _chunks(sorted(changed)):
        still_waiting.update(
            Job.objects.filter(
                pk__in=ids, state__in=(JobState.PENDING, JobState.SUSPENDED)
            ).values_list("pk", flat=True)
        )
    Job.objects.bulk_update(
        [
            Job(pk=j, pending_reasons=changed[j][0], estimated_start_at=changed[j][1])
            for j in sorted(still_waiting)
        ],
        ["pending_reasons", "estimated_start_at"],
        batch_size=CHUNK,
    )
    for job_id, message in loaded.invalid_jobs.items():
        if job_id in still_waiting and job_id in changed:  # once, when the problem appears
            log.warning("job %s skipped: %s", job_id, message)
            events.append(
                Event(
                    kind="JobInvalid",
                    reason="InvalidJob",
                    message=message,
                    job_id=job_id,
                    flow_id=loaded.job_flows.get(job_id),
                )
            )
    return len(still_waiting)


def _invalid_row_events(loaded: Loaded) -> list[Event]:
    """An event for each misconfigured queue or node, written only when its message is new
    (the latest event of that kind for the object differs), so no cycle repeats it."""
    events = []
    for name, message in loaded.invalid_queues.items():
        last = (
            Event.objects.filter(kind="QueueInvalid", message__startswith=f'queue "{name}" ')
            .order_by("-id")
            .values_list("message", flat=True)
            .first()
        )
        if last != message:
            log.warning("%s", message)
            events.append(Event(kind="QueueInvalid", reason="InvalidCapability", message=message))
    for node_id, message in loaded.invalid_nodes.items():
        last = (
            Event.objects.filter(kind="NodeInvalid", node_id=node_id)
            .order_by("-id")
            .values_list("message", flat=True)
            .first()
        )
        if last != message:
            log.warning("%s", message)
            events.append(
                Event(kind="NodeInvalid", reason="InvalidLabels", message=message, node_id=node_id)
            )
    return events


LATEST = datetime.max.replace(tzinfo=UTC)


def _from_timestamp(value: float | None) -> datetime | None:
    """An estimate as a datetime; one beyond what a datetime holds is the latest it can."""
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return LATEST


def _same_time(a: datetime | None, b: datetime | None) -> bool:
    if a is None or b is None:
        return a is b
    # Estimates move by fractions of a second every cycle; only a real change is written.
    try:
        return abs((a - b).total_seconds()) < 30
    except OverflowError:
        return False
