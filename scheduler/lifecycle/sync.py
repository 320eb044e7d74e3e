"""Job states from task states: started, succeeded, failed or lost tasks move their job.

Only jobs with a task that left Pending are read, in one query, and only jobs whose state must
change are locked and written: a cluster where nothing changed costs one query whatever its
size. The common moves (tasks started, all tasks succeeded) are written set-based, from the
states the state machine allows; failures, retries and stops go one job at a time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Min

from scheduler import notify
from scheduler.lifecycle.moves import move_job, move_jobs
from scheduler.lifecycle.transitions import (
    finish_terminating,
    now_or,
    reset_stopped_tasks,
    terminate_job,
)
from scheduler.models import Job, Task
from scheduler.states.codes import Reason
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.names import JOB_ACTIVE, OUT_OF_MEMORY, TASK_ON_NODE, JobState, TaskState

log = logging.getLogger("berth.lifecycle")


@dataclass(frozen=True, slots=True)
class TaskView:
    """What deriving a job's state reads of a task."""

    state: str
    group: str
    index: int
    exit_code: int | None
    message: str
    started_at: datetime | None
    reason: str = ""  # why it ended when its exit code does not say (OutOfMemory)


@dataclass(frozen=True, slots=True)
class JobView:
    state: str
    min_available: int


def sync_jobs(now: datetime | None = None) -> int:
    """Derive each active job's state from its tasks; returns the number of jobs changed."""
    now = now_or(now)
    views, tasks_by_job = _read_started_jobs()
    moves: dict[str, dict[int, list[TaskView]]] = defaultdict(dict)
    for job_id, tasks in tasks_by_job.items():
        move = _next_move(views[job_id], tasks)
        if move is not None:
            moves[move][job_id] = tasks
    changed = _mark_running(moves["running"], now) + _mark_succeeded(moves["succeeded"], now)
    for job_id, tasks in moves["other"].items():
        try:
            with transaction.atomic():
                job = Job.objects.select_for_update(no_key=True).get(pk=job_id)
                if _sync_job(job, tasks, now):
                    changed += 1
                    notify.changed(jobs=[job.pk])
        except Job.DoesNotExist:
            continue
        except Exception:
            log.exception("syncing job %s failed", job_id)
    return changed


def _read_started_jobs() -> tuple[dict[int, JobView], dict[int, list[TaskView]]]:
    """Active jobs with a task that left Pending, and their tasks, in one query."""
    started_jobs = Task.objects.exclude(state=TaskState.PENDING).values("job_id")
    rows = (
        Task.objects.filter(job__state__in=JOB_ACTIVE, job_id__in=started_jobs)
        .order_by("job_id", "group", "index")
        .values_list("job_id", "job__state", "job__min_available", "state", "group", "index",
                     "exit_code", "message", "started_at", "reason")
    )  # fmt: skip
    views: dict[int, JobView] = {}
    tasks_by_job: dict[int, list[TaskView]] = defaultdict(list)
    for job_id, job_state, min_available, state, group, index, code, message, started, why in rows:
        views[job_id] = JobView(job_state, min_available)
        tasks_by_job[job_id].append(TaskView(state, group, index, code, message, started, why))
    return views, tasks_by_job


def _started(tasks: Sequence[TaskView]) -> int:
    return sum(t.state in (TaskState.RUNNING, TaskState.SUCCEEDED) for t in tasks)


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
    if job.state in MACHINE.sources(JobEvent.START) and _started(tasks) >= job.min_available:
        return "running"
    return None


def _lock_jobs(ids: Iterable[int], states: tuple[str, ...]) -> dict[int, tuple[str, int | None]]:
    """Lock the jobs still in `states`: id -> (state, flow id)."""
    return {
        pk: (state, flow_id)
        for pk, state, flow_id in Job.objects.select_for_update(no_key=True)
        .filter(pk__in=sorted(ids), state__in=states)
        .order_by("id")
        .values_list("id", "state", "flow_id")
    }


def _mark_running(jobs: dict[int, list[TaskView]], now: datetime) -> int:
    """Pending jobs with min_available tasks started become Running, set-based."""
    if not jobs:
        return 0
    with transaction.atomic():
        locked = _lock_jobs(jobs, MACHINE.sources(JobEvent.START))
        messages = {j: f"{_started(jobs[j])}/{len(jobs[j])} tasks running" for j in locked}
        move_jobs(locked, JobEvent.START, messages, now)
        notify.changed(jobs=locked)
    return len(locked)


def _mark_succeeded(jobs: dict[int, list[TaskView]], now: datetime) -> int:
    """Jobs whose every task succeeded become Succeeded, set-based. A job that ran and ended
    between two cycles gets its first task's start as its own."""
    if not jobs:
        return 0
    with transaction.atomic():
        locked = _lock_jobs(jobs, MACHINE.sources(JobEvent.SUCCEED))
        first_start = dict(
            Task.objects.filter(job_id__in=sorted(locked), started_at__isnull=False)
            .values("job_id")
            .annotate(first=Min("started_at"))
            .values_list("job_id", "first")
        )  # a job none of whose tasks says when it started gets the move's time
        messages = dict.fromkeys(locked, "all tasks succeeded")
        move_jobs(locked, JobEvent.SUCCEED, messages, now, stamps=first_start)
        notify.changed(jobs=locked)
    return len(locked)


def _sync_job(job: Job, tasks: Sequence[TaskView], now: datetime) -> bool:
    on_node = [t for t in tasks if t.state in TASK_ON_NODE]
    if job.state == JobState.TERMINATING:
        if on_node:
            return False
        finish_terminating(job, now)
        return True
    if job.state == JobState.SUSPENDED:
        if on_node or all(t.state == TaskState.PENDING for t in tasks):
            return False
        reset_stopped_tasks(job)  # the job waits with fresh tasks; nothing holds resources
        return True
    failed = [t for t in tasks if t.state in (TaskState.FAILED, TaskState.LOST)]
    if failed:
        _fail_or_retry(job, failed[0], now)
        return True
    if all(t.state == TaskState.SUCCEEDED for t in tasks):
        if job.started_at is None:  # it ran and ended between two cycles
            job.started_at = min((t.started_at for t in tasks if t.started_at), default=None)
        move_job(job, JobEvent.SUCCEED, "all tasks succeeded", now)
        job.save()
        return True
    started = _started(tasks)
    if job.state in MACHINE.sources(JobEvent.START) and started >= job.min_available:
        move_job(job, JobEvent.START, f"{started}/{len(tasks)} tasks running", now)
        job.save()
        return True
    return False


def _fail_or_retry(job: Job, first: TaskView, now: datetime) -> None:
    """A task failed or was lost: restart the job while retries remain, else it fails."""
    name = f"task {first.group}-{first.index}"
    if first.reason == OUT_OF_MEMORY:  # the kernel killed it at its memory limit
        what, reason = f"{name} {first.message}", OUT_OF_MEMORY
    elif first.state == TaskState.FAILED:
        what, reason = f"{name} exited with code {first.exit_code}", Reason.TASK_FAILED
    else:
        what, reason = f"{name} was lost ({first.message or 'node lost'})", Reason.TASK_LOST
    if job.retries < job.max_retry:
        message = f"{what}; restarting (retry {job.retries + 1} of {job.max_retry})"
        retry_reason = OUT_OF_MEMORY if reason == OUT_OF_MEMORY else Reason.TASK_FAILED
        terminate_job(
            job, final_state=JobState.PENDING, reason=retry_reason, message=message, now=now
        )
        return
    suffix = f" after {job.retries} retries" if job.max_retry else ""
    terminate_job(
        job, final_state=JobState.FAILED, reason=reason, message=f"{what}{suffix}", now=now
    )
