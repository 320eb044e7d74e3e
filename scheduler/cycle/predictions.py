"""Each user's last finished run times, for EASY++ runtime predictions
(scheduler/core/predict.py; on with BERTH_RUNTIME_PREDICTIONS, docs/configuration.md).

Kept in the scheduler's process and brought up to date once per cycle, cheaply:

1. Jobs finished since the last cycle (a short overlap: a row committed late is still seen
   once), in one query on the `job_state_finished` index (state, finished_at).
2. Users seen for the first time: their last two finished jobs that ran, in one query (a
   window per user), once per user and process.

A job's run time is its finished minus its started time (whole jobs: an array element or a
retried job counts as the job it is).
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta

from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from scheduler.core import predict
from scheduler.core.model import JobInfo
from scheduler.models import Job
from scheduler.states.names import JOB_FINAL

OVERLAP = timedelta(seconds=60)


class RuntimeHistory:
    def __init__(self) -> None:
        self.runs: dict[str, deque[float]] = {}  # owner id -> last run times, oldest first
        self.seen_until: datetime | None = None  # the latest finished_at read so far
        self.recent: dict[int, datetime] = {}  # job id -> finished_at, within the overlap

    def predict(self, jobs: list[JobInfo]) -> None:
        """Set each job's prediction from its owner's last run times."""
        self._catch_up()
        owners = {j.owner for j in jobs if j.walltime is not None}
        self._load_new(owners - self.runs.keys())
        for job in jobs:
            runs = self.runs.get(job.owner)
            job.predicted = predict.predict(tuple(runs or ()), job.walltime)

    def _catch_up(self) -> None:
        """Add the jobs finished since the last look (those of users already loaded)."""
        if self.seen_until is None:
            return
        since = self.seen_until - OVERLAP
        rows = (
            Job.objects.filter(state__in=JOB_FINAL, finished_at__gte=since)
            .exclude(started_at__isnull=True)
            .order_by("finished_at", "id")
            .values_list("id", "owner_id", "started_at", "finished_at")
        )
        for job_id, owner_id, started, finished in rows:
            if job_id in self.recent:
                continue
            self.recent[job_id] = finished
            self.seen_until = max(self.seen_until, finished)
            runs = self.runs.get(str(owner_id))
            if runs is not None:
                runs.append(max(0.0, (finished - started).total_seconds()))
        floor = self.seen_until - OVERLAP
        self.recent = {i: at for i, at in self.recent.items() if at >= floor}

    def _load_new(self, owners: set[str]) -> None:
        """The last run times of users not loaded yet: one query for all of them."""
        if not owners:
            return
        if self.seen_until is None:  # from now on, catching up finds what finishes
            self.seen_until = timezone.now()
        order = (F("finished_at").desc(), F("id").desc())
        rows = (
            Job.objects.filter(
                owner_id__in=[int(o) for o in owners],
                state__in=JOB_FINAL,
                started_at__isnull=False,
                finished_at__isnull=False,
            )
            .annotate(rank=Window(RowNumber(), partition_by=F("owner_id"), order_by=order))
            .filter(rank__lte=predict.HISTORY)
            .order_by("owner_id", "-rank")  # oldest first
            .values_list("id", "owner_id", "started_at", "finished_at")
        )
        for owner in owners:
            self.runs[owner] = deque(maxlen=predict.HISTORY)
        for job_id, owner_id, started, finished in rows:
            self.runs[str(owner_id)].append(max(0.0, (finished - started).total_seconds()))
            self.recent[job_id] = finished  # (not added again by the next catch-up)


HISTORY = RuntimeHistory()
