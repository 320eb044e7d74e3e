"""Fair share and job priority, on the Django side: the weights from settings, each user's
decayed usage and shares for the snapshot, the pending jobs' factors written back, and the
`sshare`-like view (docs/planning.md).

Usage is what the usage records say (scheduler/ops/accounting.py), GPU-seconds and core-seconds
weighted by BERTH_FAIRSHARE_GPU_WEIGHT / BERTH_FAIRSHARE_CPU_WEIGHT, each day's sum halved
every BERTH_FAIRSHARE_HALF_LIFE seconds from the middle of that day; plus what running tasks
used so far (from the snapshot itself, undecayed: it is recent). The records are read in one
aggregate query (per user and day, over the last ten half-lives) at most every
BERTH_FAIRSHARE_REFRESH_SECONDS, so a cycle costs nothing more in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Sum

from scheduler.core.cycle import CycleResult
from scheduler.core.model import SchedulingPolicy, Snapshot
from scheduler.core.priority import (
    HORIZON_HALF_LIVES,
    Factors,
    PriorityWeights,
    decayed,
    fair_share_factors,
    weighted_usage,
)
from scheduler.core.types import HOLDS_RESOURCES
from scheduler.models import Job, UsageRecord, UserShare
from scheduler.sql import update_rows

# HORIZON_HALF_LIVES (ten): what is older counts less than 1/1000 of itself; with no decay,
# 400 days.
NO_DECAY_HORIZON_DAYS = 400
_cache: tuple[float, float, dict[str, float]] | None = None  # (read at, half-life, usage)
_written: dict[int, dict[str, Any]] = {}  # job -> the factors this process last wrote


def weights() -> PriorityWeights:
    """The factor weights from settings; all 0 when BERTH_PRIORITY_FACTORS is off."""
    if not getattr(settings, "BERTH_PRIORITY_FACTORS", True):
        return PriorityWeights()
    return PriorityWeights(
        age=float(getattr(settings, "BERTH_PRIORITY_WEIGHT_AGE", 0.0)),
        fair_share=float(getattr(settings, "BERTH_PRIORITY_WEIGHT_FAIRSHARE", 0.0)),
        job_size=float(getattr(settings, "BERTH_PRIORITY_WEIGHT_JOBSIZE", 0.0)),
        queue=float(getattr(settings, "BERTH_PRIORITY_WEIGHT_QUEUE", 0.0)),
        priority=float(getattr(settings, "BERTH_PRIORITY_WEIGHT_PRIORITY", 0.0)),
        max_age=float(getattr(settings, "BERTH_PRIORITY_MAX_AGE", 7 * 86400.0)),
        favor_small=bool(getattr(settings, "BERTH_PRIORITY_FAVOR_SMALL", False)),
    )


def scheduling_policy() -> SchedulingPolicy:
    """The policy the scheduler loop runs with: the defaults plus the factor weights, and how a
    runtime prediction a running job outlived is raised (docs/configuration.md)."""
    correction = str(getattr(settings, "BERTH_PREDICTION_CORRECTION", "walltime"))
    placement = str(getattr(settings, "BERTH_GPU_PLACEMENT", "fgd"))
    return SchedulingPolicy(
        priority_weights=weights(), prediction_correction=correction, gpu_placement=placement
    )


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def recorded_usage(now: datetime, fresh: bool = False) -> dict[str, float]:
    """user id (as the snapshot names owners) -> decayed weighted usage of ended attempts;
    read again when older than BERTH_FAIRSHARE_REFRESH_SECONDS (or `fresh`)."""
    global _cache
    half_life = _setting("BERTH_FAIRSHARE_HALF_LIFE", 7 * 86400.0)
    refresh = _setting("BERTH_FAIRSHARE_REFRESH_SECONDS", 60.0)
    clock = time.monotonic()
    if not fresh and _cache is not None and _cache[1] == half_life and clock - _cache[0] < refresh:
        return _cache[2]
    gpu_w = _setting("BERTH_FAIRSHARE_GPU_WEIGHT", 10.0)
    cpu_w = _setting("BERTH_FAIRSHARE_CPU_WEIGHT", 1.0)
    horizon = (
        timedelta(seconds=half_life * HORIZON_HALF_LIVES)
        if half_life > 0
        else timedelta(days=NO_DECAY_HORIZON_DAYS)
    )
    rows = (
        UsageRecord.objects.filter(finished_at__gte=now - horizon, user__isnull=False)
        .values_list("user_id", "day")
        .annotate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"))
        .order_by()
    )
    usage: dict[str, float] = {}
    for user_id, day, gpu, cpu in rows:
        midday = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
        weighted = weighted_usage(cpu or 0.0, gpu or 0.0, cpu_w, gpu_w)
        elapsed = (now - midday).total_seconds()
        usage[str(user_id)] = usage.get(str(user_id), 0.0) + decayed(weighted, elapsed, half_life)
    _cache = (clock, half_life, usage)
    return usage


def running_usage(snapshot: Snapshot) -> dict[str, float]:
    """What the snapshot's running tasks used so far, weighted as the records are."""
    gpu_w = _setting("BERTH_FAIRSHARE_GPU_WEIGHT", 10.0)
    cpu_w = _setting("BERTH_FAIRSHARE_CPU_WEIGHT", 1.0)
    usage: dict[str, float] = {}
    for job in snapshot.jobs:
        for task in job.tasks:
            if task.state in HOLDS_RESOURCES and task.started_at is not None:
                seconds = max(0.0, snapshot.now - task.started_at)
                used = weighted_usage(
                    seconds * task.resources.cpu / 1000, seconds * task.resources.gpu, cpu_w, gpu_w
                )
                usage[job.owner] = usage.get(job.owner, 0.0) + used
    return usage


def user_shares() -> dict[str, float]:
    """user id -> shares (cluster-wide rows), scaled so a user without a row has 1."""
    default = _setting("BERTH_FAIRSHARE_DEFAULT_SHARE", 1.0) or 1e-9
    rows = UserShare.objects.filter(account="").values_list("user_id", "shares")
    return {str(user_id): shares / default for user_id, shares in rows}


def fill(snapshot: Snapshot, policy: SchedulingPolicy) -> None:
    """Put usage and shares on the snapshot, when the fair-share factor is weighted."""
    if not policy.priority_weights.fair_share:
        return
    now = datetime.fromtimestamp(snapshot.now, tz=UTC)
    usage = dict(recorded_usage(now))
    for owner, used in running_usage(snapshot).items():
        usage[owner] = usage.get(owner, 0.0) + used
    snapshot.usage = usage
    snapshot.shares = user_shares()


def stored(factors: Factors, weights: PriorityWeights) -> dict[str, Any]:
    """A job's factors as stored and shown (`sprio`): the priority, each factor and what it
    adds with its weight."""
    named = factors.as_dict()
    del named["priority"]  # at the top, rounded coarser: it moves with age every cycle
    size_weight = weights.job_size
    weighted = {
        "age": round(weights.age * factors.age, 1),
        "fair_share": round(weights.fair_share * factors.fair_share, 1),
        "job_size": round(size_weight * factors.job_size, 1),
        "queue": round(weights.queue * factors.queue, 1),
        "job_priority": round(weights.priority * factors.job_priority, 1),
    }
    return {"priority": round(factors.priority, 1), "factors": named, "weighted": weighted}


def persist_factors(result: CycleResult, policy: SchedulingPolicy) -> int:
    """Write the factors of the jobs still waiting where they changed since this process
    last wrote them (rounded: age moves slowly), in set-based updates. Returns how many."""
    weights = policy.priority_weights
    if weights.off:
        return 0
    changed: dict[int, tuple[Any, ...]] = {}
    for job_id in result.pending:
        factors = result.factors.get(job_id)
        if factors is None:
            continue
        value = stored(factors, weights)
        if _written.get(job_id) != value:
            changed[job_id] = (value,)
    for job_id in [j for j in _written if j not in result.pending]:
        del _written[job_id]
    if changed:
        written = update_rows(Job, changed, per_row=["priority_factors"])
        for job_id in written:
            _written[job_id] = changed[job_id][0]
    return len(changed)


@dataclass
class ShareRow:
    """One user's line of `berth usage --shares` (as `sshare` shows it)."""

    user: str
    shares: float
    norm_shares: float
    usage: float
    norm_usage: float
    fair_share: float


def share_rows(users: dict[str, str] | None = None) -> list[ShareRow]:
    """Every user with a share row, usage or a job waiting or running; `users` maps user id
    -> name (read when None)."""
    from django.contrib.auth import get_user_model

    now = datetime.now(tz=UTC)
    usage = dict(recorded_usage(now, fresh=True))
    shares = user_shares()
    active = {str(o) for o in Job.objects.filter(state__in=("Pending", "Running"))
              .values_list("owner_id", flat=True).distinct()}  # fmt: skip
    factors = fair_share_factors(usage, shares, active)
    if users is None:
        named = get_user_model().objects.filter(pk__in=[int(u) for u in factors])
        users = {str(pk): name for pk, name in named.values_list("pk", "username")}
    total_shares = sum(shares.get(u, 1.0) for u in factors) or 1.0
    total_usage = sum(usage.values()) or 0.0
    return sorted(
        (
            ShareRow(
                user=users.get(u, u),
                shares=shares.get(u, 1.0),
                norm_shares=shares.get(u, 1.0) / total_shares,
                usage=usage.get(u, 0.0),
                norm_usage=usage.get(u, 0.0) / total_usage if total_usage else 0.0,
                fair_share=factor,
            )
            for u, factor in factors.items()
        ),
        key=lambda r: (-r.fair_share, r.user),
    )
