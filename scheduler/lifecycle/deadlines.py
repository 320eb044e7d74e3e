"""Walltime (from a job's start) and active deadline (from its submission): a job past either
is stopped and ends Failed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Q

from scheduler.lifecycle.transitions import now_or, terminate_job
from scheduler.models import Job
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.names import JobState

log = logging.getLogger("berth.lifecycle")

LATEST = datetime.max.replace(tzinfo=UTC)
# Jobs a deadline ends: those that may fail at once or be stopped (not one already stopping).
KILLABLE = tuple(s for s in MACHINE.sources(JobEvent.FAIL) if s in MACHINE.sources(JobEvent.STOP))


def after(start: datetime, seconds: float) -> datetime:
    """`start` plus `seconds`, clamped to the latest datetime there is: a huge walltime,
    deadline or TTL means "never", not an OverflowError."""
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return LATEST if seconds > 0 else datetime.min.replace(tzinfo=UTC)


def enforce_deadlines(now: datetime | None = None) -> int:
    """Kill jobs past their walltime (from start) or active deadline (from submission)."""
    now = now_or(now)
    done = 0
    for job_id, reason, message in _overdue(now):
        try:
            with transaction.atomic():
                fresh = Job.objects.select_for_update(no_key=True).get(pk=job_id)
                if fresh.state not in KILLABLE:
                    continue
                terminate_job(
                    fresh, final_state=JobState.FAILED, reason=reason, message=message, now=now
                )
                done += 1
        except Exception:
            log.exception("deadline on job %s failed", job_id)
    return done


def _overdue(now: datetime) -> list[tuple[int, str, str]]:
    """(job id, reason, message) of each job past a limit. Only these are then locked and
    written: a quiet cluster costs this one query."""
    active = Job.objects.filter(state__in=KILLABLE).filter(
        Q(walltime__isnull=False, started_at__isnull=False)
        | Q(active_deadline_seconds__isnull=False)
    )
    rows = active.order_by("id").values_list(
        "id", "state", "walltime", "started_at", "created_at", "active_deadline_seconds"
    )
    overdue: list[tuple[int, str, str]] = []
    for job_id, state, walltime, started_at, created_at, deadline in rows:
        if (
            state == JobState.RUNNING
            and walltime is not None
            and started_at is not None
            and now >= after(started_at, walltime)
        ):
            message = f"ran longer than its walltime of {walltime}s"
            overdue.append((job_id, "WalltimeExceeded", message))
        elif deadline is not None and now >= after(created_at, deadline):
            message = f"active longer than active_deadline_seconds={deadline}"
            overdue.append((job_id, "DeadlineExceeded", message))
    return overdue
