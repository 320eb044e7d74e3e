"""Carrying out what users asked for (cancel, suspend, resume), recorded by the API, the pages
and the admin on the job and done here, by the scheduler loop, one job at a time."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from scheduler import notify
from scheduler.lifecycle.moves import move_job
from scheduler.lifecycle.transitions import (
    USER_SUSPENDED,
    now_or,
    reset_stopped_tasks,
    stop_tasks,
    terminate_job,
)
from scheduler.models import Job
from scheduler.states.codes import Reason
from scheduler.states.job import JobEvent
from scheduler.states.names import JOB_FINAL, TASK_ON_NODE, JobRequest, JobState

log = logging.getLogger("berth.lifecycle")


def process_requests(now: datetime | None = None) -> int:
    """Carry out the cancel/suspend/resume requests recorded by the API and the pages."""
    now = now_or(now)
    done = 0
    jobs = Job.objects.exclude(requested_action=JobRequest.NONE).order_by("id")
    for job in jobs:
        try:
            with transaction.atomic():
                job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
                if _carry_out(job, now):
                    done += 1
        except Exception:  # one bad job never stops the others
            log.exception("request on job %s failed", job.pk)
    return done


def _carry_out(job: Job, now: datetime) -> bool:
    """One request; False when it must wait for a later cycle (it stays recorded)."""
    if job.state in JOB_FINAL:
        return _forget_request(job)
    action = job.requested_action
    if action == JobRequest.CANCEL:
        return _cancel(job, now)
    if action == JobRequest.SUSPEND:
        return _suspend(job, now)
    if action == JobRequest.RESUME:
        return _resume(job, now)
    return False


def _forget_request(job: Job) -> bool:
    job.requested_action = JobRequest.NONE
    job.save(update_fields=["requested_action"])
    return True


def _cancel(job: Job, now: datetime) -> bool:
    if job.state == JobState.TERMINATING:  # it ends Cancelled once its tasks stopped
        job.terminal_state = JobState.CANCELLED
        job.requested_action = JobRequest.NONE
        job.save(update_fields=["terminal_state", "requested_action"])
        return True
    message = "cancelled by user"
    terminate_job(
        job, final_state=JobState.CANCELLED, reason=Reason.CANCELLED, message=message, now=now
    )
    return True


def _suspend(job: Job, now: datetime) -> bool:
    if job.state == JobState.SUSPENDED:
        job.reason = USER_SUSPENDED  # a preempted job the user also suspends stays put
        job.pending_code = job.pending_message = ""
        job.estimated_start_at = None
    elif job.state == JobState.TERMINATING:
        return False  # let it finish terminating first
    else:
        stop_tasks(job)
        notify.orders(jobs=[job.pk])
        move_job(job, JobEvent.SUSPEND, "suspended by user", now)
    job.requested_action = JobRequest.NONE
    job.save()
    notify.changed(jobs=[job.pk])
    return True


def _resume(job: Job, now: datetime) -> bool:
    if job.state != JobState.SUSPENDED:
        return _forget_request(job)
    if job.tasks.filter(state__in=TASK_ON_NODE).exists():
        return False  # resumes once the agents confirmed the old tasks stopped
    reset_stopped_tasks(job)
    job.requested_action = JobRequest.NONE
    move_job(job, JobEvent.RESUME, "resumed by user", now)
    job.save()
    notify.changed(jobs=[job.pk])
    return True
