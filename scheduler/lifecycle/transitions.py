"""Stopping a job: `terminate_job` stops its tasks and ends or restarts it once they stopped,
`restart` starts it afresh as a new attempt. Every state change goes through the job movers
(lifecycle/moves.py)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from scheduler import notify
from scheduler.lifecycle.moves import move_job, move_row, move_rows
from scheduler.models import Allocation, Job, Task
from scheduler.states.codes import Reason
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.names import TASK_ON_NODE, JobRequest, JobState, TaskState
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent

# Reasons a job is Suspended: a preempted job (states.PREEMPTED) resumes by itself, a
# user-suspended one waits.
USER_SUSPENDED = Reason.USER_SUSPENDED


def now_or(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def release(tasks: Iterable[Task]) -> None:
    Allocation.objects.filter(task__in=[t.pk for t in tasks]).delete()


def terminate_job(
    job: Job, *, final_state: str, reason: str, message: str, now: datetime | None = None
) -> None:
    """Stop every task of `job`; it ends in `final_state` once the agents confirm.

    Tasks not yet on a node are marked Killed at once; tasks on a node get a kill request
    (the agent sends SIGTERM, then SIGKILL) and keep their resources until confirmed.
    `final_state` Pending means: restart the job afterwards (a retry).
    """
    now = now_or(now)
    event = MACHINE.event_into(final_state)
    MACHINE.next_state(JobState.TERMINATING, event)  # refused before anything is written
    with transaction.atomic():
        on_node = list(job.tasks.filter(state__in=TASK_ON_NODE))
        kill_pending_tasks(job.tasks.all(), message, now)
        if on_node:
            Task.objects.filter(pk__in=[t.pk for t in on_node]).update(kill_requested=True)
            move_job(job, JobEvent.STOP, message, now, reason)
            job.terminal_state = final_state
        elif event == JobEvent.RETRY:
            restart(job, now)
        else:
            move_job(job, event, message, now, reason)
        job.requested_action = JobRequest.NONE
        job.hold_reason = ""
        job.save()
        notify.changed(jobs=[job.pk], nodes=[t.node_id for t in on_node if t.node_id])
        notify.orders(nodes=[t.node_id for t in on_node if t.node_id])


def finish_terminating(job: Job, now: datetime) -> None:
    """The agents confirmed a Terminating job's tasks stopped: it goes where it was sent."""
    event = MACHINE.event_into(job.terminal_state or JobState.FAILED)
    if event == JobEvent.RETRY:
        restart(job, now)
    else:
        move_job(job, event, job.message, now, job.reason)
    job.save()


def restart(job: Job, now: datetime) -> None:
    """Put every task back to Pending under a new attempt; the job is a candidate again."""
    for task in job.tasks.all():
        fresh_attempt(task)
    job.retries += 1
    message = f"restart {job.retries} of {job.max_retry} after a task failure"
    move_job(job, JobEvent.RETRY, message, now)


def stop_tasks(job: Job) -> bool:
    """Ask the agents to stop the job's tasks; True if some still run somewhere."""
    on_node = job.tasks.filter(state__in=TASK_ON_NODE)
    on_node.update(kill_requested=True)
    job.tasks.filter(state=TaskState.PENDING).update(kill_requested=False)
    return on_node.exists()


def reset_stopped_tasks(job: Job) -> None:
    """After a suspension: the tasks start afresh (new attempt) when the job runs again."""
    stopped = job.tasks.exclude(state=TaskState.PENDING).exclude(state__in=TASK_ON_NODE)
    for task in stopped:
        fresh_attempt(task)


def fresh_attempt(task: Task) -> None:
    """The task waits to run again as a new attempt (an agent still reporting the old attempt
    is told to kill it)."""
    task.attempt += 1
    move_row(task, TASKS, TaskEvent.RETRY, timezone.now())
    task.save()


def kill_pending_tasks(tasks: QuerySet[Task], message: str, now: datetime) -> int:
    """Tasks of `tasks` not yet on a node end Killed at once (nothing runs to stop)."""
    pending = tasks.filter(state=TaskState.PENDING).values_list("pk", flat=True)
    states = dict.fromkeys(pending, TaskState.PENDING)
    guard = {"state": TaskState.PENDING}  # one placed meanwhile is stopped by its agent
    return len(move_rows(Task, TASKS, states, TaskEvent.KILL, now, guards=guard,
                         constants={"message": message}))  # fmt: skip
