"""Database rows -> a core Snapshot, in six queries whatever the backlog's size.

Nodes, devices, queues, jobs, tasks and allocations are read as plain tuples (no model
instances). A row the core cannot use harms only itself: a queue capability of the wrong
shape closes that queue (its running jobs still count), a job whose stored spec is not a spec
places nothing new, node labels that are not labels make that node take no new task. The
reasons are kept in `Loaded` so the commit writes them once as events and pending reasons.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from scheduler.core.model import (
    DeviceInfo,
    JobInfo,
    MigInfo,
    NodeInfo,
    QueueInfo,
    Snapshot,
    TaskInfo,
)
from scheduler.core.resources import DIMENSIONS, Resources
from scheduler.cycle import predictions
from scheduler.lifecycle import PREEMPTED
from scheduler.models import Allocation, Device, Job, Node, Queue, Task, sharing_problems
from scheduler.states.names import TASK_ON_NODE, JobRequest, JobState, NodeState, TaskState

UNLIMITED = 2**62
INVALID_NODE = "Invalid"  # a snapshot-only node state: takes no new task, keeps what it holds
PRESSURE_NODE = "DiskPressure"  # snapshot-only too: Ready, but its agent reports a full disk


@dataclass
class Loaded:
    """What the adapter remembers of a snapshot to write decisions back cheaply."""

    snapshot: Snapshot
    node_ids: dict[str, int]
    device_ids: dict[tuple[str, int], int]
    # job id -> (pending code, pending message) as stored: the store writes only changes.
    pending_status: dict[int, tuple[str, str]] = field(default_factory=dict)
    # Each job's stored start estimate (written by the plan phase, scheduler/cycle/planning.py).
    estimates: dict[int, datetime | None] = field(default_factory=dict)
    # Rows the core could not use, with the reason: queue name / job id / node id -> message.
    invalid_queues: dict[str, str] = field(default_factory=dict)
    invalid_jobs: dict[int, str] = field(default_factory=dict)
    invalid_nodes: dict[int, str] = field(default_factory=dict)
    job_flows: dict[int, int | None] = field(default_factory=dict)
    # queue id -> the GPU sharing modes its fractions may use (absent: any)
    queue_modes: dict[int, tuple[str, ...]] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


# --- loading --------------------------------------------------------------------------------


def load_snapshot(now: datetime | None = None) -> Loaded:
    """Read the cluster as the core sees it, in six queries whatever the backlog's size."""
    now = now or timezone.now()
    loaded = Loaded(
        snapshot=Snapshot(now=now.timestamp(), nodes=[], queues=[], jobs=[]),
        node_ids={},
        device_ids={},
    )
    names = _Names(nodes=_load_nodes(loaded), queues=_load_queues(loaded))
    names.queue_modes = loaded.queue_modes
    wanted = _wanted_jobs()
    tasks_by_job = _task_rows(wanted)
    names.devices_by_task = _devices_by_task(loaded, names.instances)
    for row in _job_rows(wanted):
        _load_job(loaded, row, tasks_by_job.get(row[0], []), names)
    if settings.BERTH_RUNTIME_PREDICTIONS:
        predictions.HISTORY.predict(loaded.snapshot.jobs)
    return loaded


@dataclass
class _Names:
    """Row ids -> what the core calls them: node and queue names, a task's device indices."""

    nodes: dict[int, str]
    queues: dict[int, str]
    devices_by_task: dict[int, list[int]] = field(default_factory=dict)
    instances: dict[int, str] = field(default_factory=dict)  # task id -> its MIG instance
    # queue id -> the GPU sharing modes its fractions may use (absent: any)
    queue_modes: dict[int, tuple[str, ...]] = field(default_factory=dict)


def _wanted_jobs() -> QuerySet[Job]:
    """Candidates: pending jobs not held, and jobs suspended by preemption (they resume by
    themselves). Holders: running and terminating jobs, and suspended jobs whose tasks are
    still stopping."""
    return Job.objects.filter(
        Q(state=JobState.PENDING, hold_reason="")
        | Q(state__in=(JobState.RUNNING, JobState.TERMINATING, JobState.SUSPENDED))
    ).exclude(requested_action=JobRequest.CANCEL)


def _job_rows(wanted: QuerySet[Job]) -> QuerySet[Job, tuple[Any, ...]]:
    # The spec's task list comes as text and is parsed only for jobs with a task to place:
    # running jobs' selectors matter to nothing.
    spec_tasks = Cast(KeyTransform("tasks", "spec"), TextField())
    return (
        wanted.annotate(spec_tasks=spec_tasks)
        .order_by("id")
        .values_list("id", "name", "queue_id", "owner_id", "priority", "preemptible",
                     "min_available", "created_at", "walltime", "state", "reason",
                     "requested_action", "pending_code", "pending_message", "flow_id",
                     "spec_tasks", "estimated_start_at")
    )  # fmt: skip


def _task_rows(wanted: QuerySet[Job]) -> dict[int, list[tuple[Any, ...]]]:
    """The wanted jobs' tasks that are waiting or on a node, by job; the job query is a
    subquery: one statement whatever the backlog's size. Ended tasks matter to nothing."""
    rows = (
        Task.objects.filter(job__in=wanted.values("pk"))
        .filter(state__in=(TaskState.PENDING, *TASK_ON_NODE))
        .order_by("job_id", "group", "index")
        .values_list("id", "job_id", "group", "index", "cpu", "memory", "gpu", "state",
                     "node_id", "kill_requested", "started_at", "assigned_at", "gpu_share",
                     "gpu_memory", "gpu_mig")
    )  # fmt: skip
    tasks_by_job: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        tasks_by_job[row[1]].append(row)
    return tasks_by_job


def _devices_by_task(loaded: Loaded, instances: dict[int, str]) -> dict[int, list[int]]:
    """Each placed task's device indices; `instances` gets the MIG instance each holds."""
    device_index = {pk: index for (_, index), pk in loaded.device_ids.items()}
    devices_by_task: dict[int, list[int]] = defaultdict(list)
    for task_id, device_id, mig in Allocation.objects.values_list("task_id", "device_id", "mig"):
        if device_id in device_index:
            devices_by_task[task_id].append(device_index[device_id])
        if mig:
            instances[task_id] = mig
    return devices_by_task


def _load_job(
    loaded: Loaded, row: tuple[Any, ...], tasks: list[tuple[Any, ...]], names: _Names
) -> None:
    """Add one job to the snapshot, or say in `loaded` why it cannot be scheduled: one job
    whose stored spec makes no sense places nothing new; what it already holds still
    counts, and everyone else goes on."""
    job_id = row[0]
    try:
        selectors: dict[str, dict[str, str]] | None = (
            _selectors(json.loads(row[15]) if row[15] is not None else None)
            if any(t[7] == TaskState.PENDING for t in tasks)
            else {}
        )
    except (TypeError, ValueError, AttributeError) as exc:
        loaded.invalid_jobs[job_id] = f"cannot be scheduled: its stored spec is invalid ({exc})"
        selectors = None
    try:
        info = _job_info(row, tasks, selectors, names)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        loaded.invalid_jobs[job_id] = f"cannot be scheduled: {type(exc).__name__}: {exc}"
        info = None
    loaded.job_flows[job_id] = row[14]
    loaded.pending_status[job_id] = (row[12], row[13])
    loaded.estimates[job_id] = row[16]
    if info is not None:
        loaded.snapshot.jobs.append(info)


def _load_nodes(loaded: Loaded) -> dict[int, str]:
    nodes = list(
        Node.objects.order_by("name").values_list(
            "id", "name", "cpu", "memory", "labels", "state", "usage__pressure", "gpu_sharing"
        )
    )
    devices_by_node = _device_rows()
    node_name = {pk: name for pk, name, *_ in nodes}
    for pk, name, cpu, memory, labels, state, pressure, modes in nodes:
        if pressure and state == NodeState.READY:
            state = PRESSURE_NODE  # its agent says its disk is full: no new task
        devices = devices_by_node[pk]
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            loaded.invalid_nodes[pk] = f"node {name}: labels must map names to strings"
            labels, state = {}, INVALID_NODE
        loaded.snapshot.nodes.append(
            NodeInfo(
                name=name,
                allocatable=Resources(cpu=cpu, memory=memory, gpu=sum(not d[7] for d in devices)),
                labels=dict(labels),
                state=state,
                devices=[
                    DeviceInfo(
                        index=d[2],
                        uuid=d[3],
                        model=d[4],
                        healthy=d[5],
                        memory=d[6],
                        mig=tuple(d[7]),
                    )  # fmt: skip
                    for d in devices
                ],
                sharing=_modes(modes),
            )
        )
        loaded.node_ids[name] = pk
        for d in devices:
            loaded.device_ids[(name, d[2])] = d[0]
    return node_name


def _device_rows() -> dict[int, list[tuple[Any, ...]]]:
    """Per node, its devices' rows (id, node id, index, uuid, model, healthy, memory, MIG
    instances), with each device's MIG instances read in the same query (a left join: one
    row per instance)."""
    devices_by_node: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    last: tuple[Any, ...] | None = None
    row: list[Any]
    for *row, profile, mig_uuid, mig_memory in Device.objects.order_by(
        "node_id", "index", "mig_instances__uuid"
    ).values_list(
        "id", "node_id", "index", "uuid", "model", "healthy", "memory",
        "mig_instances__profile", "mig_instances__uuid", "mig_instances__memory",
    ):  # fmt: skip
        if last is None or last[0] != row[0]:
            last = (*row, [])
            devices_by_node[row[1]].append(last)
        if mig_uuid is not None:
            last[7].append(MigInfo(profile, mig_uuid, mig_memory))
    return devices_by_node


def _load_queues(loaded: Loaded) -> dict[int, str]:
    queue_name = {}
    rows = Queue.objects.order_by("name").values_list(
        "id", "name", "weight", "capability", "reclaimable", "priority", "open",
        "max_user_running_gpus", "max_user_running_cpus", "max_user_running_jobs",
        "user_limits_exempt_staff", "gpu_sharing",
    )  # fmt: skip
    staff: frozenset[str] | None = None
    for pk, name, weight, capability, reclaimable, priority, is_open, *limits in rows:
        queue_name[pk] = name
        gpus, cpus, jobs, exempt_staff, modes = limits
        if (allowed := _queue_modes(modes)) is not None:
            loaded.queue_modes[pk] = allowed
        if exempt_staff and staff is None and (gpus, cpus, jobs) != (None, None, None):
            staff = _staff_ids()
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
                max_user_gpus=gpus,
                max_user_cpus=cpus,
                max_user_jobs=jobs,
                limits_exempt=(staff or frozenset()) if exempt_staff else frozenset(),
            )
        )
    return queue_name


def _modes(value: Any) -> tuple[str, ...]:
    """A node's GPU sharing modes as stored; anything else than known modes offers none."""
    if not isinstance(value, list) or sharing_problems(value):
        return ()
    return tuple(sorted(set(value)))


def _queue_modes(allowed: Any) -> tuple[str, ...] | None:
    """The GPU sharing modes a queue allows (sorted; None: any). A value the model refuses,
    or an empty list, allows none: ("none",) matches no node's mode."""
    if allowed is None:
        return None
    ok = isinstance(allowed, list) and not sharing_problems(allowed)
    return tuple(sorted(set(allowed))) if ok and allowed else ("none",)


def _staff_ids() -> frozenset[str]:
    """Staff users, by id as the snapshot names owners (read only where a queue exempts
    them from its per-user limits)."""
    users = get_user_model().objects.filter(is_staff=True, is_active=True)
    return frozenset(str(pk) for pk in users.values_list("pk", flat=True))


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
    names: _Names,
) -> JobInfo | None:
    (job_id, name, queue_id, owner_id, priority, preemptible, min_available, created_at,
     walltime, state, reason, requested_action, *_) = row  # fmt: skip
    holding = any(t[7] in TASK_ON_NODE for t in tasks)
    core_state = _core_job_state(state, reason, holding)
    if selectors is None:  # invalid spec: keep only what the job already holds
        if not holding:
            return None
        tasks = [t for t in tasks if t[7] in TASK_ON_NODE]
    if core_state is None:
        return None
    stopping = state in (JobState.TERMINATING, JobState.SUSPENDED)
    return JobInfo(
        id=job_id,
        name=name,
        queue=names.queues[queue_id],
        owner=str(owner_id),
        priority=priority,
        preemptible=preemptible,
        min_available=min_available,
        created_at=created_at.timestamp(),
        walltime=float(walltime) if walltime else None,
        state=core_state,
        tasks=[
            _task_info(t, selectors or {}, names, stopping, names.queue_modes.get(queue_id, ()))
            for t in tasks
        ],
        suspend_requested=requested_action == JobRequest.SUSPEND,
    )


def _task_info(
    row: tuple[Any, ...],
    selectors: dict[str, dict[str, str]],
    names: _Names,
    stopping: bool,
    modes: tuple[str, ...],
) -> TaskInfo:
    (task_id, _, group, index, cpu, memory, gpu, state, node_id, kill_requested, started_at,
     assigned_at, gpu_share, gpu_memory, gpu_mig) = row  # fmt: skip
    return TaskInfo(
        id=task_id,
        group=group,
        index=index,
        resources=Resources(cpu=cpu, memory=memory, gpu=gpu),
        node_selector=selectors.get(group, {}),
        state=_core_task_state(state, kill_requested, stopping),
        node=names.nodes.get(node_id) if node_id else None,
        devices=tuple(names.devices_by_task.get(task_id, ())),
        started_at=_ts(started_at or assigned_at),
        gpu_share=gpu_share,
        gpu_memory=gpu_memory,
        gpu_modes=modes if gpu_share else (),
        gpu_mig=gpu_mig,
        gpu_instance=names.instances.get(task_id, ""),
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
