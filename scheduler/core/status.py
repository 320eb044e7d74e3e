"""Why the core did not place a job: one `Status` with a code from a fixed set, a message for
people, and per node reason how many nodes gave it (as kube-scheduler's framework Status and
Slurm's pending reason codes do). `NeverFits` is the one unresolvable code: waiting does not
help, only a change to the job or to the cluster does."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Code(StrEnum):
    WAITING_FOR_RESOURCES = "WaitingForResources"  # fits some node once resources free up
    NEVER_FITS = "NeverFits"  # no node (or the whole empty cluster, for a gang) could hold it
    QUEUE_QUOTA = "QueueQuota"  # the queue's capability is in use by its running jobs
    USER_LIMIT = "UserLimit"  # the owner's running jobs use their per-user limit of the queue
    GANG_INCOMPLETE = "GangIncomplete"  # fewer than min_available tasks placeable at once
    RESERVED = "Reserved"  # first blocked job: holds the backfill reservation
    RESERVED_FOR_OTHER = "ReservedForOther"  # would delay the reserved job if started now
    PRIORITY = "Priority"  # a job before it in order waits (strict order)
    PREEMPTING = "Preempting"  # evicted lower-priority jobs are releasing for it
    HELD = "Held"  # held outside the core, e.g. a flow's parallelism limit or an array's %K
    QUEUE_CLOSED = "QueueClosed"
    QUEUE_MISSING = "QueueMissing"
    SCHEDULER_ERROR = "SchedulerError"  # a plugin raised on this job; others went on
    NOTHING_TO_PLACE = "NothingToPlace"


UNRESOLVABLE = frozenset({Code.NEVER_FITS})


@dataclass
class Status:
    code: Code
    message: str
    # node reason -> how many nodes gave it, e.g. {"insufficient gpu": 8, "node selector
    # mismatch": 4}; empty when the reason is not about nodes.
    node_reasons: dict[str, int] = field(default_factory=dict)
    estimated_start: float | None = None

    @property
    def unresolvable(self) -> bool:
        return self.code in UNRESOLVABLE
