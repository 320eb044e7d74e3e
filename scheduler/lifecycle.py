"""Job lifecycle: the state machine the scheduler loop runs after placing jobs.

Each public function is one unit of work that returns how much it did, so the loop and the
tests call them directly. Resources are released only when an agent confirms a task stopped
(its heartbeat deletes the task's allocations) or when its node is lost; until then a task that
was asked to stop still holds its node's cpu, memory and devices.

Job states: Pending -> Running -> Succeeded | Failed | Cancelled; Running -> Terminating ->
(terminal_state); Pending/Running -> Suspended -> Pending. A restart after a task failure goes
through Terminating with terminal_state Pending.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import (
    Case,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from scheduler import accounting, notify
from scheduler.events import record
from scheduler.models import Allocation, Event, Job, Node, Task
from scheduler.states import (
    JOB_FINAL,
    TASK_ON_NODE,
    JobRequest,
    JobState,
    NodeState,
    TaskState,
)

log = logging.getLogger("berth.lifecycle")

# Reasons a job is Suspended; a preempted job resumes by itself, a user-suspended one waits.
PREEMPTED = "Preempted"
USER_SUSPENDED = "UserSuspended"


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


LATEST = datetime.max.replace(tzinfo=UTC)


def after(start: datetime, seconds: float) -> datetime:
    """`start` plus `seconds`, clamped to the latest datetime there is: a huge walltime,
    deadline or TTL means "never", not an OverflowError."""
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return LATEST if seconds > 0 else datetime.min.replace(tzinfo=UTC)


def _set_state(job: Job, state: str, reason: str, message: str, now: datetime) -> None:
    """Move `job` to `state` (saved by the caller) and write the event that says why."""
    old = job.state
    job.state = state
    job.reason = reason
    job.message = message
    if state == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if state in JOB_FINAL:
        accounting.record_job_end(job, state)
        job.finished_at = now
        job.pending_reasons = []
        job.estimated_start_at = None
    record("JobStateChanged", reason, f"{old} -> {state}: {message}".rstrip(": "), job=job)


def _release(tasks: Iterable[Task]) -> None:
    Allocation.objects.filter(task__in=[t.pk for t in tasks]).delete()


def terminate_job(
    job: Job, *, final_state: str, reason: str, message: str, now: datetime | None = None
) -> None:
    """Stop every task of `job`; it ends in `final_state` once the agents confirm.

    Tasks not yet on a node are marked Killed at once; tasks on a node get a kill request
    (the agent sends SIGTERM, then SIGKILL) and keep their resources until confirmed.
    `final_state` Pending means: restart the job afterwards (a retry).
    """
    now = _now(now)
    with transaction.atomic():
        on_node = list(job.tasks.filter(state__in=TASK_ON_NODE))
        job.tasks.filter(state=TaskState.PENDING).update(
            state=TaskState.KILLED, finished_at=now, message=message
        )
        if on_node:
            Task.objects.filter(pk__in=[t.pk for t in on_node]).update(kill_requested=True)
            job.terminal_state = final_state
            _set_state(job, JobState.TERMINATING, reason, message, now)
        elif final_state == JobState.PENDING:
            _restart(job, now)
        else:
            job.terminal_state = ""
            _set_state(job, final_state, reason, message, now)
        job.requested_action = JobRequest.NONE
        job.hold_reason = ""
        job.save()
        notify.changed(jobs=[job.pk], nodes=[t.node_id for t in on_node if t.node_id])
        notify.orders(nodes=[t.node_id for t in on_node if t.node_id])


def _restart(job: Job, now: datetime) -> None:
    """Put every task back to Pending under a new attempt; the job is a candidate again."""
    for task in job.tasks.all():
        _fresh_attempt(task)
    job.retries += 1
    job.terminal_state = ""
    job.started_at = None
    _set_state(
        job,
        JobState.PENDING,
        "Retrying",
        f"restart {job.retries} of {job.max_retry} after a task failure",
        now,
    )


def _stop_tasks(job: Job) -> bool:
    """Ask the agents to stop the job's tasks; True if some still run somewhere."""
    on_node = job.tasks.filter(state__in=TASK_ON_NODE)
    on_node.update(kill_requested=True)
    job.tasks.filter(state=TaskState.PENDING).update(kill_requested=False)
    return on_node.exists()


def _reset_stopped_tasks(job: Job) -> None:
    """After a suspension: the tasks start afresh (new attempt) when the job runs again."""
    stopped = job.tasks.exclude(state=TaskState.PENDING).exclude(state__in=TASK_ON_NODE)
    for task in stopped:
        _fresh_attempt(task)


def _fresh_attempt(task: Task) -> None:
    """The task waits to run again as a new attempt (an agent still reporting the old attempt
    is told to kill it)."""
    task.attempt += 1
    task.state = TaskState.PENDING
    task.node = None
    task.device_indices = []
    task.exit_code = None
    task.kill_requested = False
    task.assigned_at = task.started_at = task.finished_at = None
    task.save()


# --- 1. requests users made (cancel, suspend, resume) -------------------------------------


def process_requests(now: datetime | None = None) -> int:
    """Carry out the cancel/suspend/resume requests recorded by the API and the pages."""
    now = _now(now)
    done = 0
    jobs = Job.objects.exclude(requested_action=JobRequest.NONE).order_by("id")
    for job in jobs:
        try:
            with transaction.atomic():
                job = Job.objects.select_for_update().get(pk=job.pk)
                if _carry_out(job, now):
                    done += 1
        except Exception:  # one bad job never stops the others
            log.exception("request on job %s failed", job.pk)
    return done


def _carry_out(job: Job, now: datetime) -> bool:
    action = job.requested_action
    if job.state in JOB_FINAL:
        job.requested_action = JobRequest.NONE
        job.save(update_fields=["requested_action"])
        return True
    if action == JobRequest.CANCEL:
        if job.state == JobState.TERMINATING:
            job.terminal_state = JobState.CANCELLED
            job.requested_action = JobRequest.NONE
            job.save(update_fields=["terminal_state", "requested_action"])
            return True
        terminate_job(
            job,
            final_state=JobState.CANCELLED,
            reason="Cancelled",
            message="cancelled by user",
            now=now,
        )
        return True
    if action == JobRequest.SUSPEND:
        if job.state == JobState.SUSPENDED:
            job.reason = USER_SUSPENDED  # a preempted job the user also suspends stays put
        elif job.state == JobState.TERMINATING:
            return False  # let it finish terminating first; the request stays recorded
        else:
            _stop_tasks(job)
            notify.orders(jobs=[job.pk])
            job.hold_reason = ""
            _set_state(job, JobState.SUSPENDED, USER_SUSPENDED, "suspended by user", now)
        job.requested_action = JobRequest.NONE
        job.pending_reasons = []
        job.estimated_start_at = None
        job.save()
        notify.changed(jobs=[job.pk])
        return True
    if action == JobRequest.RESUME:
        if job.state != JobState.SUSPENDED:
            job.requested_action = JobRequest.NONE
            job.save(update_fields=["requested_action"])
            return True
        if job.tasks.filter(state__in=TASK_ON_NODE).exists():
            return False  # resumes once the agents confirmed the old tasks stopped
        _reset_stopped_tasks(job)
        job.requested_action = JobRequest.NONE
        _set_state(job, JobState.PENDING, "Resumed", "resumed by user", now)
        job.save()
        notify.changed(jobs=[job.pk])
        return True
    return False


# --- 2. job states from task states ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskView:
    """What deriving a job's state reads of a task."""

    state: str
    group: str
    index: int
    exit_code: int | None
    message: str
    started_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobView:
    state: str
    min_available: int


def sync_jobs(now: datetime | None = None) -> int:
    """Derive each active job's state from its tasks; returns the number of jobs changed.

    Only jobs with a task that left Pending are read, in one query, and only jobs whose
    state must change are locked and written: a cluster where nothing changed costs one
    query whatever its size. The common moves (tasks started, all tasks succeeded) are
    written set-based; failures, retries and stops go one job at a time.
    """
    now = _now(now)
    active = (JobState.PENDING, JobState.RUNNING, JobState.TERMINATING, JobState.SUSPENDED)
    started_jobs = Task.objects.exclude(state=TaskState.PENDING).values("job_id")
    views: dict[int, JobView] = {}
    tasks_by_job: dict[int, list[TaskView]] = defaultdict(list)
    rows = (
        Task.objects.filter(job__state__in=active, job_id__in=started_jobs)
        .order_by("job_id", "group", "index")
        .values_list(
            "job_id",
            "job__state",
            "job__min_available",
            "state",
            "group",
            "index",
            "exit_code",
            "message",
            "started_at",
        )
    )
    for job_id, job_state, min_available, state, group, index, code, message, started in rows:
        views[job_id] = JobView(job_state, min_available)
        tasks_by_job[job_id].append(TaskView(state, group, index, code, message, started))
    moves: dict[str, dict[int, list[TaskView]]] = defaultdict(dict)
    for job_id, tasks in tasks_by_job.items():
        move = _next_move(views[job_id], tasks)
        if move is not None:
            moves[move][job_id] = tasks
    changed = _mark_running(moves["running"], now) + _mark_succeeded(moves["succeeded"], now)
    for job_id, tasks in moves["other"].items():
        try:
            with transaction.atomic():
                job = Job.objects.select_for_update().get(pk=job_id)
                if _sync_job(job, tasks, now):
                    changed += 1
                    notify.changed(jobs=[job.pk])
        except Job.DoesNotExist:
            continue
        except Exception:
            log.exception("syncing job %s failed", job_id)
    return changed


def _next_move(job: JobView, tasks: list[TaskView]) -> str | None:
    """Which change `_sync_job` would make: None, "running", "succeeded" or "other"."""
    on_node = any(t.state in TASK_ON_NODE for t in tasks)
    if job.state == JobState.TERMINATING:
        return None if on_node else "other"
    if job.state == JobState.SUSPENDED:
        return None if on_node or all(t.state == TaskState.PENDING for t in tasks) else "other"
    if any(t.state in (TaskState.FAILED, TaskState.LOST) for t in tasks):
        return "other"
    if all(t.state == TaskState.SUCCEEDED for t in tasks):
        return "succeeded"
    started = sum(t.state in (TaskState.RUNNING, TaskState.SUCCEEDED) for t in tasks)
    if job.state == JobState.PENDING and started >= job.min_available:
        return "running"
    return None


def _lock_jobs(ids: Iterable[int], states: tuple[str, ...]) -> dict[int, tuple[str, int | None]]:
    """Lock the jobs still in `states`: id -> (state, flow id)."""
    return {
        pk: (state, flow_id)
        for pk, state, flow_id in Job.objects.select_for_update()
        .filter(pk__in=sorted(ids), state__in=states)
        .order_by("id")
        .values_list("id", "state", "flow_id")
    }


def _mark_running(jobs: dict[int, list[TaskView]], now: datetime) -> int:
    """Pending jobs with min_available tasks started become Running, in one statement."""
    if not jobs:
        return 0
    with transaction.atomic():
        locked = _lock_jobs(jobs, (JobState.PENDING,))
        if not locked:
            return 0
        messages = {}
        for job_id in locked:
            tasks = jobs[job_id]
            started = sum(t.state in (TaskState.RUNNING, TaskState.SUCCEEDED) for t in tasks)
            messages[job_id] = f"{started}/{len(tasks)} tasks running"
        Job.objects.filter(pk__in=sorted(locked)).update(
            state=JobState.RUNNING,
            reason="Started",
            message=_per_job(messages),
            started_at=Coalesce(F("started_at"), Value(now)),
            pending_reasons=[],
            estimated_start_at=None,
        )
        Event.objects.bulk_create(
            Event(
                kind="JobStateChanged",
                reason="Started",
                job_id=job_id,
                flow_id=flow_id,
                message=f"{old} -> Running: {messages[job_id]}",
            )
            for job_id, (old, flow_id) in locked.items()
        )
        notify.changed(jobs=locked)
    return len(locked)


def _mark_succeeded(jobs: dict[int, list[TaskView]], now: datetime) -> int:
    """Jobs whose every task succeeded become Succeeded, in one statement. A job that ran
    and ended between two cycles gets its first task's start as its own."""
    if not jobs:
        return 0
    with transaction.atomic():
        locked = _lock_jobs(jobs, (JobState.PENDING, JobState.RUNNING))
        if not locked:
            return 0
        first_start = (
            Task.objects.filter(job_id=OuterRef("pk"))
            .values("job_id")
            .annotate(first=Min("started_at"))
            .values("first")
        )
        Job.objects.filter(pk__in=sorted(locked)).update(
            state=JobState.SUCCEEDED,
            reason="Completed",
            message="all tasks succeeded",
            started_at=Coalesce(F("started_at"), Subquery(first_start)),
            finished_at=now,
            pending_reasons=[],
            estimated_start_at=None,
        )
        Event.objects.bulk_create(
            Event(
                kind="JobStateChanged",
                reason="Completed",
                job_id=job_id,
                flow_id=flow_id,
                message=f"{old} -> Succeeded: all tasks succeeded",
            )
            for job_id, (old, flow_id) in locked.items()
        )
        accounting.record_jobs_end(locked, JobState.SUCCEEDED)
        notify.changed(jobs=locked)
    return len(locked)


def _per_job(values: dict[int, str]) -> Case:
    """One value per job in a single UPDATE."""
    return Case(*[When(pk=pk, then=Value(v)) for pk, v in values.items()], output_field=TextField())


def _sync_job(job: Job, tasks: Sequence[TaskView], now: datetime) -> bool:
    on_node = [t for t in tasks if t.state in TASK_ON_NODE]
    if job.state == JobState.TERMINATING:
        if on_node:
            return False
        target = job.terminal_state or JobState.FAILED
        if target == JobState.PENDING:
            _restart(job, now)
        else:
            job.terminal_state = ""
            _set_state(job, target, job.reason, job.message, now)
        job.save()
        return True
    if job.state == JobState.SUSPENDED:
        if on_node or all(t.state == TaskState.PENDING for t in tasks):
            return False
        _reset_stopped_tasks(job)  # the job waits with fresh tasks; nothing holds resources
        return True

    failed = [t for t in tasks if t.state in (TaskState.FAILED, TaskState.LOST)]
    if failed:
        first = failed[0]
        what = (
            f"task {first.group}-{first.index} exited with code {first.exit_code}"
            if first.state == TaskState.FAILED
            else f"task {first.group}-{first.index} was lost ({first.message or 'node lost'})"
        )
        if job.retries < job.max_retry:
            terminate_job(
                job,
                final_state=JobState.PENDING,
                reason="TaskFailed",
                message=f"{what}; restarting (retry {job.retries + 1} of {job.max_retry})",
                now=now,
            )
        else:
            suffix = f" after {job.retries} retries" if job.max_retry else ""
            terminate_job(
                job,
                final_state=JobState.FAILED,
                reason="TaskFailed" if first.state == TaskState.FAILED else "TaskLost",
                message=f"{what}{suffix}",
                now=now,
            )
        return True

    if all(t.state == TaskState.SUCCEEDED for t in tasks):
        if job.started_at is None:  # it ran and ended between two cycles
            job.started_at = min((t.started_at for t in tasks if t.started_at), default=None)
        _set_state(job, JobState.SUCCEEDED, "Completed", "all tasks succeeded", now)
        job.save()
        return True
    started = sum(t.state in (TaskState.RUNNING, TaskState.SUCCEEDED) for t in tasks)
    if job.state == JobState.PENDING and started >= job.min_available:
        job.pending_reasons = []
        job.estimated_start_at = None
        _set_state(job, JobState.RUNNING, "Started", f"{started}/{len(tasks)} tasks running", now)
        job.save()
        return True
    return False


# --- 3. walltime and active deadlines ----------------------------------------------------


def enforce_deadlines(now: datetime | None = None) -> int:
    """Kill jobs past their walltime (from start) or active deadline (from submission)."""
    now = _now(now)
    done = 0
    active = Job.objects.filter(
        state__in=(JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
    ).filter(
        Q(walltime__isnull=False, started_at__isnull=False)
        | Q(active_deadline_seconds__isnull=False)
    )
    overdue: list[tuple[int, str, str]] = []
    rows = active.order_by("id").values_list(
        "id", "state", "walltime", "started_at", "created_at", "active_deadline_seconds"
    )
    for job_id, state, walltime, started_at, created_at, deadline in rows:
        # Only the overdue are locked and written: a quiet cluster costs this one query.
        if (
            state == JobState.RUNNING
            and walltime is not None
            and started_at is not None
            and now >= after(started_at, walltime)
        ):
            reason, message = "WalltimeExceeded", f"ran longer than its walltime of {walltime}s"
            overdue.append((job_id, reason, message))
        elif deadline is not None and now >= after(created_at, deadline):
            message = f"active longer than active_deadline_seconds={deadline}"
            overdue.append((job_id, "DeadlineExceeded", message))
    for job_id, reason, message in overdue:
        try:
            with transaction.atomic():
                fresh = Job.objects.select_for_update().get(pk=job_id)
                if fresh.state in JOB_FINAL or fresh.state == JobState.TERMINATING:
                    continue
                terminate_job(
                    fresh, final_state=JobState.FAILED, reason=reason, message=message, now=now
                )
                done += 1
        except Exception:
            log.exception("deadline on job %s failed", job_id)
    return done


# --- 4. node health and drain ------------------------------------------------------------


def check_nodes(now: datetime | None = None) -> int:
    """Nodes silent past the heartbeat timeout become NotReady and their tasks Lost;
    draining nodes with nothing left on them become Drained."""
    now = _now(now)
    cutoff = now - timedelta(seconds=settings.BERTH_HEARTBEAT_TIMEOUT)
    done = 0
    silent = Node.objects.exclude(state=NodeState.NOT_READY).filter(
        Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True)
    )
    for node in silent:
        with transaction.atomic():
            claimed = (
                Node.objects.filter(pk=node.pk)
                .exclude(state=NodeState.NOT_READY)
                .update(state=NodeState.NOT_READY)
            )
            if not claimed:
                continue
            why = f"node {node.name} not ready"
            lost = _lose(Task.objects.filter(node=node), why, now, reason="NodeNotReady")
            record(
                "NodeNotReady",
                "HeartbeatTimeout",
                f"no heartbeat since {node.last_heartbeat}; {len(lost)} tasks lost",
                node=node,
            )
            notify.changed(nodes=[node.pk])
            done += 1
    draining = Node.objects.filter(admin_state=NodeState.DRAINING).exclude(
        tasks__state__in=TASK_ON_NODE
    )
    for node in draining:
        with transaction.atomic():
            updated = Node.objects.filter(pk=node.pk, admin_state=NodeState.DRAINING).update(
                admin_state=NodeState.DRAINED,
                state=NodeState.NOT_READY
                if node.state == NodeState.NOT_READY
                else NodeState.DRAINED,
            )
            if updated:
                record("NodeDrained", "Drained", "no task left on the node", node=node)
                notify.changed(nodes=[node.pk])
                done += 1
    return done


# --- 4b. nodes that are deleted --------------------------------------------------------


def _lose(
    tasks: QuerySet[Task], why: str, now: datetime, reason: str = "NodeDeleted"
) -> list[Task]:
    """End the tasks of `tasks` that are on a node as Lost, free their devices and account
    for what they used (a silent node, a deleted one); `sync_jobs` then sends each job
    through its retry policy."""
    on_node = tasks.filter(state__in=TASK_ON_NODE).select_related("job")
    lost = list(on_node.select_for_update(of=("self",)))
    _release(lost)
    Task.objects.filter(pk__in=[t.pk for t in lost]).update(
        state=TaskState.LOST, finished_at=now, message=why
    )
    accounting.record_task_ends(lost, now, state=TaskState.LOST)
    for job in {t.job_id: t.job for t in lost}.values():
        record("TaskLost", reason, why, job=job)
    notify.changed(jobs={t.job_id for t in lost})
    return lost


def lose_tasks_of_node(node: Node, why: str, now: datetime | None = None) -> list[Task]:
    """Called inside the transaction that deletes `node` (scheduler.operations.delete_node),
    so no task stays Running or Terminating on a node that no longer exists."""
    return _lose(Task.objects.filter(node=node), why, _now(now))


def lose_orphaned_tasks(now: datetime | None = None) -> int:
    """Tasks still Assigned or Running whose node row is gone (deleted some other way, e.g.
    from a shell: the foreign key is set to null) end Lost; returns how many."""
    with transaction.atomic():
        orphans = Task.objects.filter(node__isnull=True)
        return len(_lose(orphans, "its node was removed", _now(now)))


# --- 5. TTL cleanup ----------------------------------------------------------------------


def ttl_expired_jobs(now: datetime | None = None) -> list[int]:
    """Finished jobs whose TTL has passed. Never a suspended job, nor one whose suspension
    was asked for (it has no finish time), nor a flow's job (its flow's TTL owns it)."""
    now = _now(now)
    candidates = (
        Job.objects.filter(
            state__in=JOB_FINAL,
            finished_at__isnull=False,
            ttl_seconds_after_finished__isnull=False,
            flow__isnull=True,
        )
        .exclude(requested_action=JobRequest.SUSPEND)
        .values_list("id", "finished_at", "ttl_seconds_after_finished")
    )
    return [job_id for job_id, finished_at, ttl in candidates if after(finished_at, ttl) <= now]


def cleanup_ttl(now: datetime | None = None, batch: int = 500) -> int:
    """Delete expired finished jobs with their tasks, logs and events, in small batches."""
    ids = ttl_expired_jobs(now)
    deleted = 0
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        try:
            with transaction.atomic():
                # Re-check inside the transaction: a job resubmitted or suspended meanwhile stays.
                doomed = Job.objects.filter(
                    pk__in=chunk, state__in=JOB_FINAL, finished_at__isnull=False
                ).exclude(requested_action=JobRequest.SUSPEND)
                doomed_ids = list(doomed.values_list("id", flat=True))
                doomed.delete()
                notify.changed(jobs=doomed_ids)
                deleted += len(doomed_ids)
        except Exception:
            log.exception("TTL cleanup of %d jobs failed", len(chunk))
    return deleted
