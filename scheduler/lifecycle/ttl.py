"""TTL cleanup: finished jobs are deleted with their tasks, logs and events once their
ttl_seconds_after_finished has passed (a flow's jobs go with their flow, scheduler/flows/ttl.py)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from scheduler import notify
from scheduler.lifecycle.deadlines import after
from scheduler.lifecycle.transitions import now_or
from scheduler.models import Job
from scheduler.states.names import JOB_FINAL, JobRequest

log = logging.getLogger("berth.lifecycle")


def ttl_expired_jobs(now: datetime | None = None) -> list[int]:
    """Finished jobs whose TTL has passed. Never a suspended job, nor one whose suspension
    was asked for (it has no finish time), nor a flow's job (its flow's TTL owns it)."""
    now = now_or(now)
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
