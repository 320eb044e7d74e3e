"""Job arrays: one spec, many elements (docs/arrays.md).

An array is a parent Job row (array_size set, no tasks, always held so the scheduler never
offers it) and one element Job per index, each a real job with its own tasks, retries and
pending reason. Everything here is set-based, so a 10,000-element array costs a few queries:

1. `submit_array` creates the parent, the elements and their tasks with bulk inserts and one
   event, in one transaction.
2. `cancel_requested_elements` (each cycle, before user requests) cancels, in bulk, elements
   asked to stop that have nothing on a node; the rest go through the usual per-job path.
3. `release_held_elements` (each cycle, before the snapshot) keeps the `%K` limit: an element
   is active from its release until it finishes, and at most K are active at once, so at most
   K can be Assigned or Running.
4. `refresh_parents` (each cycle, at its end) writes each parent's counts and derived state.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from scheduler import notify
from scheduler.core.quantity import parse_cpu, parse_gpu_field, parse_memory
from scheduler.intake.arrayspec import format_indices, parse_array
from scheduler.intake.specs import array_max_elements
from scheduler.jobs.events import record
from scheduler.lifecycle.moves import move_job, move_jobs
from scheduler.lifecycle.transitions import kill_pending_tasks
from scheduler.models import Event, Job, Queue, Task
from scheduler.sql import insert_array_elements, update_rows
from scheduler.states.codes import EventKind, Reason
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.names import (
    JOB_ACTIVE,
    JOB_FINAL,
    TASK_ON_NODE,
    JobRequest,
    JobState,
)

# What a parent's refresh from its elements writes.
PARENT_COLUMNS = (
    "state", "reason", "message", "started_at", "finished_at", "array_counts",
    "hold_reason", "pending_code", "pending_message", "estimated_start_at",
)  # fmt: skip
BATCH = 2000  # rows per INSERT/UPDATE statement (SQLite's variable limit allows it)
PARENT_ACTIVE = (JobState.PENDING, JobState.RUNNING)
# name, replicas, cpu, memory, the GPU columns (gpu, gpu_share, gpu_memory)
TaskGroup = tuple[str, int, int, int, dict[str, Any]]


def limit_text(limit: int) -> str:
    """The hold reason of an element waiting for a slot (Slurm: JobArrayTaskLimit)."""
    return f"array limit: {limit}/{limit} active"


def _chunks(ids: list[int], size: int = BATCH) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


# --- 1. submission -----------------------------------------------------------------------


def _gpu_columns(resources: dict[str, Any]) -> dict[str, Any]:
    """A task row's GPU columns: whole devices, or one device's share and GPU memory."""
    devices, share, profile = parse_gpu_field(resources["gpu"])
    memory = parse_memory(resources["gpu_memory"]) if "gpu_memory" in resources else 0
    return {"gpu": devices, "gpu_share": share, "gpu_memory": memory, "gpu_mig": profile}


def submit_array(owner: Any, spec: dict[str, Any], queue: Queue, labels: dict[str, str]) -> Job:
    """Create the parent, its elements and their tasks from a normalized spec with "array"."""
    parsed = parse_array(spec["array"], array_max_elements())
    size, limit = len(parsed.indices), parsed.limit
    # Resources are parsed once for all elements, not once per task row.
    groups: list[TaskGroup] = [
        (g["name"], g["replicas"], parse_cpu(g["resources"]["cpu"]),
         parse_memory(g["resources"]["memory"]), _gpu_columns(g["resources"]))
        for g in spec["tasks"]
    ]  # fmt: skip
    per_element = sum(g[1] for g in groups)
    common = {
        "name": spec["name"], "owner": owner, "queue": queue, "priority": spec["priority"],
        "preemptible": spec["preemptible"], "min_available": spec["min_available"],
        "max_retry": spec["max_retry"],
        "ttl_seconds_after_finished": spec["ttl_seconds_after_finished"],
    }  # fmt: skip
    with transaction.atomic():
        # The parent has no walltime or deadline of its own: its elements carry them, so the
        # lifecycle never stops the parent ahead of its elements.
        parent = Job.objects.create(
            **common, spec=spec, labels=labels, array_size=size, array_limit=limit,
            array_counts={"states": {JobState.PENDING.value: size}, "held": 0},
            hold_reason=f"array of {size}: {size} pending",
        )  # fmt: skip
        element = Job(
            **common, spec={k: v for k, v in spec.items() if k != "array"},
            labels={**labels, "berth/array": str(parent.pk)}, walltime=spec["walltime"],
            active_deadline_seconds=spec["active_deadline_seconds"], array_parent=parent,
        )  # fmt: skip
        create_elements(element, parsed.indices, limit, groups)
        shown = f", at most {limit} at once" if limit is not None else ""
        record(
            EventKind.JOB_SUBMITTED, Reason.SUBMITTED,
            f"array {parsed.text}: {size} elements of {per_element} task(s){shown},"
            f" in queue {queue.name}",
            job=parent,
        )  # fmt: skip
        notify.changed(jobs=[parent.pk])
    return parent


def create_elements(
    element: Job, indices: tuple[int, ...], limit: int | None, groups: list[TaskGroup],
    *, set_based: bool | None = None,
) -> None:  # fmt: skip
    """One job per index like `element` (the first `limit` released, the rest held), each
    with its task rows. On PostgreSQL in a few INSERT ... SELECT statements (sql.py);
    elsewhere with bulk_create. Both write the same rows (tests/app/test_sql.py)."""
    held = limit_text(limit) if limit is not None else ""
    released = limit if limit is not None else len(indices)
    if set_based is None:
        set_based = connection.vendor == "postgresql"
    if set_based:
        insert_array_elements(element, indices, released, held, groups)
        return
    elements = []
    for position, index in enumerate(indices):
        row = copy.copy(element)
        row.array_index, row.hold_reason = index, held if position >= released else ""
        elements.append(row)
    Job.objects.bulk_create(elements, batch_size=BATCH)
    Task.objects.bulk_create(
        (
            Task(job_id=row.pk, group=name, index=i, cpu=cpu, memory=memory, **gpu)
            for row in elements
            for name, replicas, cpu, memory, gpu in groups
            for i in range(replicas)
        ),
        batch_size=BATCH,
    )


# --- 2. cancel -----------------------------------------------------------------------------


def request_cancel(parent: Job, user: Any) -> bool:
    """Ask every active element of `parent` to stop; False if the array has finished.

    The parent itself is never asked (it has no tasks): it becomes Cancelled once its
    elements have stopped, so its TTL can never remove an element that still runs.
    """
    now = timezone.now()
    with transaction.atomic():
        parent = Job.objects.select_for_update().get(pk=parent.pk)
        if parent.state in JOB_FINAL:
            return False
        asked = (
            parent.array_elements.filter(state__in=JOB_ACTIVE)
            .exclude(requested_action=JobRequest.CANCEL)
            .update(requested_action=JobRequest.CANCEL, requested_at=now)
        )
        who = getattr(user, "username", "") or "system"
        parent.requested_at = now
        parent.reason, parent.message = (
            Reason.CANCEL_REQUESTED,
            f"by {who}: {asked} elements to stop",
        )
        parent.save(update_fields=["requested_at", "reason", "message"])
        record(
            EventKind.JOB_CANCEL_REQUESTED,
            Reason.USER_REQUEST,
            f"by {who}: {asked} elements",
            job=parent,
        )
        notify.changed(jobs=[parent.pk])
    return True


def cancel_requested_elements(now: datetime | None = None) -> int:
    """Cancel, in bulk, elements asked to stop that have no task on a node (pending or
    suspended and stopped); one event per array. Returns how many were cancelled."""
    now = now or timezone.now()
    doomed = (
        Job.objects.filter(
            array_parent__isnull=False,
            requested_action=JobRequest.CANCEL,
            state__in=MACHINE.sources(JobEvent.CANCEL, only=(JobState.PENDING, JobState.SUSPENDED)),
        )
        .exclude(tasks__state__in=TASK_ON_NODE)
        .order_by("id")
    )
    with transaction.atomic():
        rows = list(
            doomed.select_for_update(of=("self",)).values_list(
                "id", "state", "array_parent_id", "array_index"
            )
        )
        if not rows:
            return 0
        for chunk in _chunks([r[0] for r in rows]):
            kill_pending_tasks(Task.objects.filter(job_id__in=chunk), "cancelled by user", now)
        locked = {pk: (state, None) for pk, state, _, _ in rows}
        move_jobs(locked, JobEvent.CANCEL, dict.fromkeys(locked, "cancelled by user"), now,
                  constants={"requested_action": JobRequest.NONE}, record_each=False)  # fmt: skip
        by_parent: dict[int, list[int]] = defaultdict(list)
        for _, _, parent_id, index in rows:
            by_parent[parent_id].append(index)
        Event.objects.bulk_create(
            Event(
                kind=EventKind.JOB_STATE_CHANGED,
                reason=Reason.CANCELLED,
                job_id=parent_id,
                message=f"{len(indices)} elements cancelled: {format_indices(indices)}"[:2000],
            )  # fmt: skip
            for parent_id, indices in by_parent.items()
        )
        notify.changed(jobs=list(by_parent))
    return len(rows)


# --- 3. the %K limit -----------------------------------------------------------------------


def release_held_elements() -> int:
    """Give each limited array's free slots to its held elements, lowest index first.

    An element is active from its release until it finishes (Pending, Running, Terminating,
    Suspended, hold_reason empty). Should an array have more than K active (a held element
    suspended and then resumed by its user), its released elements not yet on a node are held
    again, highest index first. Returns how many elements were released.
    """
    parents = list(
        Job.objects.filter(
            array_size__isnull=False, array_limit__isnull=False, state__in=PARENT_ACTIVE
        ).values_list("id", "array_limit")
    )
    if not parents:
        return 0
    active = dict(
        Job.objects.filter(
            array_parent_id__in=[p for p, _ in parents], state__in=JOB_ACTIVE, hold_reason=""
        )
        .values_list("array_parent_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    released = 0
    for parent_id, limit in parents:
        free = limit - active.get(parent_id, 0)
        elements = Job.objects.filter(array_parent_id=parent_id, state=JobState.PENDING)
        if free > 0:
            ids = list(
                elements.exclude(hold_reason="")
                .order_by("array_index")
                .values_list("pk", flat=True)[:free]
            )
            released += Job.objects.filter(pk__in=ids).update(hold_reason="")
        elif free < 0:
            ids = list(
                elements.filter(hold_reason="")
                .exclude(tasks__state__in=TASK_ON_NODE)
                .order_by("-array_index")
                .values_list("pk", flat=True)[:-free]
            )
            Job.objects.filter(pk__in=ids).update(hold_reason=limit_text(limit))
    return released


# --- 4. the parent's summary -----------------------------------------------------------------


def count_elements(parent_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """{parent id: {"states": {state: n}, "held": n}} in one query."""
    out: dict[int, dict[str, Any]] = {}
    rows = (
        Job.objects.filter(array_parent_id__in=list(parent_ids))
        .values_list("array_parent_id", "state")
        .annotate(n=Count("id"), held=Count("id", filter=~Q(hold_reason="")))
        .order_by()
    )
    for parent_id, state, n, held in rows:
        entry = out.setdefault(parent_id, {"states": {}, "held": 0})
        entry["states"][state] = n
        entry["held"] += held
    return out


def _derived_state(parent: Job, states: dict[str, int]) -> str:
    if not any(states.get(s, 0) for s in JOB_ACTIVE):
        if states.get(JobState.FAILED, 0):
            return JobState.FAILED
        if states.get(JobState.CANCELLED, 0) or not states:
            return JobState.CANCELLED
        return JobState.SUCCEEDED
    if parent.state == JobState.RUNNING or sum(states.values()) > states.get(JobState.PENDING, 0):
        return JobState.RUNNING  # some element started (or finished): the array runs
    return JobState.PENDING


def summary(size: int, counts: dict[str, Any], limit: int | None) -> str:
    """ "array of 1000: 10 running, 990 pending (980 held by the limit of 10)"."""
    states: dict[str, int] = counts.get("states", {})
    parts = [f"{n} {state.lower()}" for state, n in sorted(states.items()) if n]
    text = f"array of {size}: {', '.join(parts) or 'no elements left'}"
    if counts.get("held"):
        text += f" ({counts['held']} held by the limit of {limit})"
    return text[:200]


def refresh_parents(now: datetime | None = None) -> int:
    """Write each active parent's element counts and derived state; returns parents changed."""
    now = now or timezone.now()
    parents = list(Job.objects.filter(array_size__isnull=False, state__in=PARENT_ACTIVE))
    if not parents:
        return 0
    counts = count_elements(p.pk for p in parents)
    changed: list[Job] = []
    with transaction.atomic():
        for parent in parents:
            fresh = counts.get(parent.pk, {"states": {}, "held": 0})
            state = _derived_state(parent, fresh["states"])
            size, limit = parent.array_size or 0, parent.array_limit
            text = "" if state in JOB_FINAL else summary(size, fresh, limit)
            if (fresh, state, text) == (parent.array_counts, parent.state, parent.hold_reason):
                continue
            if state != parent.state:
                _move(parent, state, fresh, now)
            parent.array_counts, parent.hold_reason = fresh, text
            changed.append(parent)
        update_rows(Job, {p.pk: tuple(getattr(p, c) for c in PARENT_COLUMNS) for p in changed},
                    PARENT_COLUMNS)  # fmt: skip
        notify.changed(jobs=[p.pk for p in changed])
    return len(changed)


def _move(parent: Job, state: str, counts: dict[str, Any], now: datetime) -> None:
    """The parent follows its elements (through the job mover; it is not counted as a
    finished job itself: its elements are)."""
    event = MACHINE.event_into(state)
    if state == JobState.RUNNING:
        move_job(parent, event, "an element started", now)
        return
    states = Counter(counts["states"])
    done = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()) if n)
    why = Reason.ELEMENT_FAILED if state == JobState.FAILED else ""
    parent.started_at = parent.started_at or now  # its elements ran, or none ever will
    move_job(parent, event, f"every element finished: {done}" if done else "no elements left",
             now, why)  # fmt: skip


# --- the agent's environment and the API's detail --------------------------------------------


def array_env(job: Job) -> dict[str, str]:
    """BERTH_ARRAY_* variables of an element's tasks (Slurm's SLURM_ARRAY_*); {} otherwise."""
    if job.array_parent_id is None:
        return {}
    size = Job.objects.filter(pk=job.array_parent_id).values_list("array_size", flat=True).first()
    return {
        "BERTH_ARRAY_JOB_ID": str(job.array_parent_id),
        "BERTH_ARRAY_INDEX": str(job.array_index),
        "BERTH_ARRAY_TASK_COUNT": str(size or 0),
    }


def indices_by_state(parent: Job) -> dict[str, str]:
    """Each state's element indices as ranges, the way squeue shows 123_[5-999]."""
    by_state: dict[str, list[int]] = defaultdict(list)
    rows = parent.array_elements.order_by().values_list("state", "array_index")
    for state, index in rows.iterator(chunk_size=10_000):
        by_state[state].append(index)
    return {state: format_indices(indices) for state, indices in sorted(by_state.items())}
