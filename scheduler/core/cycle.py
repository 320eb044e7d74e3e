"""One scheduling cycle: open a session on the snapshot, run the actions, return decisions."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from scheduler.core.actions import ACTIONS
from scheduler.core.model import SchedulerConfig, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.session import Bind, Evict, Session
from scheduler.core.status import Code, Status

__all__ = ["Bind", "CycleResult", "Code", "Evict", "Status", "run_cycle"]


@dataclass
class CycleResult:
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: dict[int, Status] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)


def run_cycle(snapshot: Snapshot, config: SchedulerConfig | None = None) -> CycleResult:
    """Decide what to bind, evict and why jobs wait. The snapshot is not modified; the same
    snapshot always gives the same decisions."""
    config = config or SchedulerConfig()
    started = time.perf_counter()
    session = Session(snapshot, config, default_plugins(config))
    timings: dict[str, float] = {"open": time.perf_counter() - started}
    for name in config.actions:
        tick = time.perf_counter()
        ACTIONS[name](session)
        timings[name] = time.perf_counter() - tick
    for job in session.candidates:
        if job.id not in session.placed and job.id not in session.pending:
            # Only a job with no pending task (nothing to place) can get here.
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
    )
