"""One scheduling cycle: open a session on the snapshot, run the actions, return decisions."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from scheduler.core.actions import allocate, enqueue, preempt, reclaim
from scheduler.core.backfill import backfill
from scheduler.core.model import SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.priority import Factors
from scheduler.core.session import Session
from scheduler.core.status import Code, Status
from scheduler.core.types import Bind, Evict

__all__ = ["Bind", "CycleResult", "Code", "Evict", "Status", "run_actions", "run_cycle"]

ACTION_FUNCTIONS: dict[str, Callable[[Session], None]] = {
    "enqueue": enqueue,
    "allocate": allocate,
    "preempt": preempt,
    "reclaim": reclaim,
    "backfill": backfill,
}


@dataclass
class CycleResult:
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: dict[int, Status] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    # job -> its priority factors (jobs ordered this cycle; empty with the factors off)
    factors: dict[int, Factors] = field(default_factory=dict)


def run_cycle(snapshot: Snapshot, config: SchedulingPolicy | None = None) -> CycleResult:
    """Decide what to bind, evict and why jobs wait. The snapshot is not modified; the same
    snapshot always gives the same decisions."""
    config = config or SchedulingPolicy()
    with collector_paused():
        started = time.perf_counter()
        session = Session(snapshot, config, default_plugins(config))
        result = run_actions(session, {"open": time.perf_counter() - started})
        # Freed now, by reference counting, not walked by the collection that turning the
        # collector back on sets off (it walks every object made since it was paused).
        del session
    return result


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back on after it (if it was
    on: nested blocks leave it to the outermost).

    A cycle makes many small objects (binds, statuses, tuples) that are not garbage: each
    full collection they trigger walks every object of the snapshot and the session, and at
    100k pending jobs on 10k nodes those walks were about a third of the cycle's CPU time
    (docs/benchmarks.md). Nothing is freed later than it would be but cyclic garbage, which
    the next collection after the block finds."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_actions(session: Session, timings: dict[str, float] | None = None) -> CycleResult:
    """Run the policy's actions on an open session and collect what they decided."""
    with collector_paused():
        return _run_actions(session, timings)


def _run_actions(session: Session, timings: dict[str, float] | None) -> CycleResult:
    timings = dict(timings or {})
    started = time.perf_counter() - sum(timings.values())
    for name in session.config.actions:
        tick = time.perf_counter()
        ACTION_FUNCTIONS[name](session)
        timings[name] = time.perf_counter() - tick
    session.own_statuses()
    # Only a job with no pending task (nothing to place) can be neither placed nor pending
    # after the actions; a standing session holds none such.
    for job in [] if session.standing else session.candidates:
        if job.id not in session.placed and job.id not in session.pending:
            session.set_pending(job, Status(Code.NOTHING_TO_PLACE, "no pending task to place"))
    timings["total"] = time.perf_counter() - started
    session.stats["binds"] = len(session.binds)
    session.stats["evictions"] = len(session.evictions)
    session.stats["pending"] = len(session.pending)
    return CycleResult(
        binds=session.binds,
        evictions=session.evictions,
        pending=session.pending,
        timings=timings,
        stats=session.stats,
        factors=session.factors,
    )
