"""The scheduler loop's plan phase: queue positions and start estimates for waiting jobs.

`annotate` runs right after the core, on the same snapshot: it plans every waiting job
(scheduler/core/plan.py, at most `BERTH_PLAN_DEPTH` of them) and puts each estimate on the
job's pending status, so the commit writes it with the reason, only where it changed.
`persist` runs after the commit: it writes the positions that changed (and clears those of
jobs that left their queue) in a few set-based statements, and tells pages about every job
whose position or estimate changed.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction

from scheduler import notify
from scheduler.core.cycle import CycleResult
from scheduler.core.model import SchedulingPolicy
from scheduler.core.plan import Plan, fingerprint, plan_positions, plan_starts
from scheduler.cycle.snapshot import Loaded
from scheduler.models import Job
from scheduler.sql import chunks, update_rows

# An estimate that moved less than this is not news (it drifts with every cycle's "now").
ESTIMATE_TOLERANCE_SECONDS = 30.0
# A plan is made again at least this often even when nothing changed (time passes).
REPLAN_SECONDS = 30.0
# The last plan and what it was made from: (fingerprint, made at, depth, plan).
_last: tuple[int, float, int, Plan] | None = None


def plan_depth() -> int:
    return int(getattr(settings, "BERTH_PLAN_DEPTH", 500))


def plan_interval() -> float:
    return float(getattr(settings, "BERTH_PLAN_INTERVAL", 10))


def annotate(loaded: Loaded, result: CycleResult, config: SchedulingPolicy | None) -> Plan:
    """Plan the waiting jobs and set each one's estimate on its pending status. When
    nothing the plan depends on changed since the last cycle, the last plan is reused; a
    full plan is made at most every `BERTH_PLAN_INTERVAL` seconds (as Slurm's backfill runs
    every `bf_interval`), in between only positions are recomputed and jobs keep their last
    estimate, so a busy cluster's cycles stay short."""
    global _last
    depth, now = plan_depth(), loaded.snapshot.now
    key = fingerprint(loaded.snapshot, result, config)
    age = now - _last[1] if _last is not None and _last[2] == depth else None
    if _last is not None and age is not None and _last[0] == key and age < REPLAN_SECONDS:
        plan = _last[3]
    elif _last is not None and age is not None and 0 <= age < plan_interval():
        positions = plan_positions(loaded.snapshot, result, config)
        last = _last[3].starts
        plan = Plan(positions=positions, starts={j: last.get(j) for j in positions})
    else:
        plan = plan_starts(loaded.snapshot, result, config, depth=depth)
        _last = (key, now, depth, plan)
    for job_id, start in plan.starts.items():
        status = result.pending.get(job_id)
        if status is not None:
            status.estimated_start = start
    return plan


def persist(loaded: Loaded, plan: Plan) -> int:
    """Write the positions and estimates that changed (estimates that moved less than
    ESTIMATE_TOLERANCE_SECONDS are not news); notify pages of those jobs. Returns how many
    jobs changed."""
    old = dict(Job.objects.filter(queue_position__isnull=False).values_list("id", "queue_position"))
    moved = {j: p for j, p in plan.positions.items() if old.get(j) != p}
    left = [j for j in old if j not in plan.positions]
    estimated = _estimates_changed(loaded, plan)
    if moved or left or estimated:
        with transaction.atomic():
            update_rows(Job, {j: (p,) for j, p in moved.items()}, per_row=["queue_position"])
            starts = {j: (_when(plan.starts[j]),) for j in estimated}
            update_rows(Job, starts, per_row=["estimated_start_at"])
            for ids in chunks(sorted(left)):
                Job.objects.filter(pk__in=ids).update(queue_position=None)
    changed = set(moved) | set(left) | estimated
    notify.changed(jobs=changed)
    return len(changed)


def _estimates_changed(loaded: Loaded, plan: Plan) -> set[int]:
    changed = set()
    for job_id, start in plan.starts.items():
        if not _same(start, loaded.estimates.get(job_id)):
            changed.add(job_id)
    return changed


def _when(start: float | None) -> datetime | None:
    if start is None:
        return None
    try:
        return datetime.fromtimestamp(start, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _same(start: float | None, old: datetime | None) -> bool:
    if start is None or old is None:
        return start is None and old is None
    try:
        new = datetime.fromtimestamp(start, tz=UTC)
        return abs((new - old).total_seconds()) < ESTIMATE_TOLERANCE_SECONDS
    except (OverflowError, OSError, ValueError):
        return False
