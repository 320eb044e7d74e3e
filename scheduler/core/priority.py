"""One job priority from named factors, as Slurm's multifactor priority plugin computes it.

Each factor is a number in [0, 1] (the job's own `priority` is the exception: it counts as
it is, as Slurm's nice does), multiplied by its weight and summed:

    priority = w_age * age + w_fairshare * fairshare + w_size * size
             + w_queue * queue + w_priority * job.priority

- age: how long the job has waited, over `max_age` (1 from then on);
- fairshare: Slurm's classic `2^(-U/S)`: U the user's decayed usage over everyone's, S the
  user's share over everyone's (1 for a user who used nothing, 0.5 for one who used exactly
  their share, towards 0 for one far over it);
- size: the job's dominant share of the cluster (what its gang needs at least), or one minus
  it when `favor_small`;
- queue: the queue's priority over the highest queue priority (0 when none is positive).

With every weight 0 ("factors off") jobs are ordered as before the factors existed: by
their own priority, then age; with weights, by the sum first, then the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from scheduler.core.resources import tuple_new

DAY = 86400.0
# Usage older than this many half-lives is no longer read: it counts under 1/1000 of itself.
HORIZON_HALF_LIVES = 10


@dataclass(frozen=True)
class PriorityWeights:
    """The weights of the factors (Slurm's PriorityWeightAge, PriorityWeightFairshare,
    PriorityWeightJobSize, PriorityWeightPartition, and a weight per unit of the job's own
    priority), PriorityMaxAge and PriorityFavorSmall."""

    age: float = 0.0
    fair_share: float = 0.0
    job_size: float = 0.0
    queue: float = 0.0
    priority: float = 0.0
    max_age: float = 7 * DAY
    favor_small: bool = False

    def __post_init__(self) -> None:
        for name in ("age", "fair_share", "job_size", "queue", "priority"):
            value = getattr(self, name)
            if not 0 <= value <= 1e9:
                raise ValueError(f"priority weight {name} must be in [0, 1e9], got {value!r}")
        if not self.max_age > 0:
            raise ValueError(f"max_age must be > 0, got {self.max_age!r}")

    @property
    def off(self) -> bool:
        """Every weight 0: the order is the job's own priority, then age, as it always was."""
        return not (self.age or self.fair_share or self.job_size or self.queue or self.priority)


class Factors(NamedTuple):
    """A pending job's factors and the priority they add up to (as `sprio` shows them).
    Immutable; a named tuple because a cycle makes one per pending job (a tuple is several
    times cheaper to make than a frozen dataclass, as `Resources`), with the same fields,
    repr and hash as the frozen dataclass it was, and equal to a `Factors` of the same
    fields (also, unlike the dataclass, to a plain tuple of them)."""

    priority: float
    age: float
    fair_share: float
    job_size: float
    queue: float
    job_priority: int

    def as_dict(self) -> dict[str, float]:
        return {
            "priority": round(self.priority, 3),
            "age": round(self.age, 4),
            "fair_share": round(self.fair_share, 4),
            "job_size": round(self.job_size, 4),
            "queue": round(self.queue, 4),
            "job_priority": self.job_priority,
        }


def decayed(usage: float, elapsed: float, half_life: float) -> float:
    """`usage` recorded `elapsed` seconds ago, as it counts now: halved every `half_life`
    seconds (Slurm's PriorityDecayHalfLife); a half-life of 0 means no decay."""
    if half_life <= 0 or elapsed <= 0:
        return usage
    return usage * 2.0 ** (-elapsed / half_life)


def weighted_usage(
    cpu_seconds: float, gpu_seconds: float, cpu_weight: float, gpu_weight: float
) -> float:
    """Usage as fair share counts it: core-seconds and GPU-seconds, each by its weight
    (BERTH_FAIRSHARE_CPU_WEIGHT, BERTH_FAIRSHARE_GPU_WEIGHT: a GPU-second counts more)."""
    return gpu_weight * gpu_seconds + cpu_weight * cpu_seconds


def fair_share_factor(usage: float, total_usage: float, share: float, total_shares: float) -> float:
    """Slurm's classic fair-share factor `2^(-U/S)`: U = usage / total_usage, S = share /
    total_shares. A user with no share gets 0; with no usage anywhere, everyone gets 1."""
    if share <= 0 or total_shares <= 0:
        return 0.0
    normalised_usage = usage / total_usage if total_usage > 0 else 0.0
    return float(2.0 ** (-normalised_usage / (share / total_shares)))


def fair_share_factors(
    usage: dict[str, float], shares: dict[str, float], users: set[str], default_share: float = 1.0
) -> dict[str, float]:
    """Each user's factor among `users` and everyone with a share or a usage: a user with no
    share row gets `default_share`."""
    everyone = set(users) | set(usage) | set(shares)
    share_of = {u: max(0.0, shares.get(u, default_share)) for u in everyone}
    total_usage = sum(max(0.0, usage.get(u, 0.0)) for u in everyone)
    total_shares = sum(share_of.values())
    return {
        u: fair_share_factor(max(0.0, usage.get(u, 0.0)), total_usage, share_of[u], total_shares)
        for u in everyone
    }


def age_factor(waited: float, max_age: float) -> float:
    return min(max(waited, 0.0) / max_age, 1.0)


def combine(weights: PriorityWeights, age: float, fair: float, size: float, queue: float,
            job_priority: int) -> Factors:  # fmt: skip
    """The factors with the priority they add up to under `weights`."""
    if weights.favor_small:
        size = 1.0 - size
    total = (
        weights.age * age
        + weights.fair_share * fair
        + weights.job_size * size
        + weights.queue * queue
        + weights.priority * job_priority
    )
    return new_factors(total, age, fair, size, queue, job_priority)


def new_factors(
    priority: float, age: float, fair: float, size: float, queue: float, job_priority: int
) -> Factors:
    """`Factors(priority, age, fair, size, queue, job_priority)` without the named tuple's
    generated `__new__`: the same tuple, for the one a cycle makes per pending job."""
    return tuple_new(Factors, (priority, age, fair, size, queue, job_priority))
