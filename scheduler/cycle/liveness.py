"""The scheduler's heartbeat: after each cycle the leader records when it ran and how long
each phase took (cumulative histogram buckets) in one database row, so /healthz and /metrics
in any web worker process, on any machine, see the same numbers. Counts carry over when
another scheduler becomes leader."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler.models import SchedulerHeartbeat

HEARTBEAT_PK = 1
# Upper bounds (seconds) of the cycle phase histogram; +Inf is the total count.
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# /healthz calls the scheduler down after this many intervals without a cycle.
STALE_INTERVALS = 5


def _observe(histograms: dict[str, dict[str, object]], phase: str, seconds: float) -> None:
    entry = histograms.setdefault(phase, {"buckets": [0] * len(PHASE_BUCKETS), "sum": 0.0,
                                          "count": 0})  # fmt: skip
    buckets = entry["buckets"]
    assert isinstance(buckets, list)
    if len(buckets) != len(PHASE_BUCKETS):  # the bounds changed in an upgrade: start afresh
        buckets[:] = [0] * len(PHASE_BUCKETS)
    for i, bound in enumerate(PHASE_BUCKETS):
        if seconds <= bound:
            buckets[i] += 1
            break
    entry["sum"] = float(entry["sum"]) + seconds  # type: ignore[arg-type]
    entry["count"] = int(entry["count"]) + 1  # type: ignore[call-overload]


def record_cycle(
    phases: Mapping[str, float], total_seconds: float, interval: float,
    now: datetime | None = None,
) -> None:  # fmt: skip
    """Record one finished cycle: its phase timings and the time it ended."""
    now = now or timezone.now()
    with transaction.atomic():
        row = SchedulerHeartbeat.objects.select_for_update().filter(pk=HEARTBEAT_PK).first()
        if row is None:
            row = SchedulerHeartbeat(pk=HEARTBEAT_PK, last_cycle_at=now)
        histograms = dict(row.phase_histograms or {})
        for phase, seconds in phases.items():
            _observe(histograms, phase, seconds)
        _observe(histograms, "total", total_seconds)
        row.phase_histograms = histograms
        row.leader = f"{socket.gethostname()}:{os.getpid()}"[:255]
        row.interval_seconds = interval
        row.last_cycle_at = now
        row.last_cycle_seconds = total_seconds
        row.cycles += 1
        row.save()


@dataclass(frozen=True)
class SchedulerHealth:
    ok: bool
    age_seconds: float | None  # None: no cycle ever recorded
    message: str


def scheduler_health(now: datetime | None = None) -> SchedulerHealth:
    """Has a cycle run within STALE_INTERVALS of the scheduler's own interval?"""
    now = now or timezone.now()
    row = (
        SchedulerHeartbeat.objects.filter(pk=HEARTBEAT_PK)
        .values("last_cycle_at", "interval_seconds")
        .first()
    )
    if row is None:
        return SchedulerHealth(False, None, "no scheduler cycle recorded yet")
    age = max(0.0, (now - row["last_cycle_at"]).total_seconds())
    interval = row["interval_seconds"] or settings.BERTH_SCHEDULER_INTERVAL
    limit = STALE_INTERVALS * interval
    if age > limit:
        return SchedulerHealth(False, age, f"no cycle for {age:.1f}s (limit {limit:.1f}s)")
    return SchedulerHealth(True, age, "ok")
