"""The scheduler cycle: snapshot -> core -> decisions -> commit -> flows -> lifecycle.

`run_scheduler_cycle` is one unit of work, called by `manage.py run_scheduler`, by `manage.py up`
and directly by tests. A failure in one phase is logged and the other phases still run, so
one bad flow or job never stops placement for everyone else.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from scheduler import lifecycle, notify, sql
from scheduler.core.cycle import run_cycle
from scheduler.core.model import SchedulingPolicy
from scheduler.cycle import fairshare, planning, store
from scheduler.cycle.leader import LostLeadership
from scheduler.cycle.meter import QueryMeter
from scheduler.flows import controller as flow_controller
from scheduler.flows import ttl as flow_ttl
from scheduler.jobs import arrays
from scheduler.lifecycle import idle_sessions
from scheduler.ops import gpu_history, gpu_idle
from scheduler.ops.faults import dependency_down

log = logging.getLogger("berth.scheduler")

# How often `run_scheduler` runs the checks the clock decides (deadlines, silent nodes, TTLs).
HOUSEKEEPING_SECONDS = 1.0
# How often at least `run_scheduler` runs a full cycle when nothing changed (run_scheduler_cycle).
FULL_CYCLE_SECONDS = 5.0
# The phases of a cycle, in order; `total` is the whole cycle.
PHASES = ("load", "core", "plan", "commit", "flows", "lifecycle", "publish")


@dataclass
class PhaseTiming:
    """Wall time of one phase, and the queries it ran with the time spent inside them."""

    seconds: float = 0.0
    queries: int = 0
    db_seconds: float = 0.0


@dataclass
class CycleReport:
    phases: dict[str, PhaseTiming] = field(
        default_factory=lambda: {name: PhaseTiming() for name in PHASES}
    )
    total_seconds: float = 0.0
    core_timings: dict[str, float] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    # The phase running now: the query meter counts each query towards it.
    current_phase: str = field(default="load", repr=False)
    # Nothing changed since the previous cycle: this one did nothing (see run_scheduler_cycle).
    skipped: bool = False

    @property
    def durations(self) -> dict[str, float]:
        """Seconds per phase, and `total` (for benchmarks and metrics)."""
        return {name: t.seconds for name, t in self.phases.items()} | {"total": self.total_seconds}

    @property
    def queries(self) -> int:
        return sum(t.queries for t in self.phases.values())

    @property
    def db_seconds(self) -> float:
        return sum(t.db_seconds for t in self.phases.values())

    @property
    def busy(self) -> bool:
        """Did the cycle change anything (or fail somewhere)?"""
        c = self.counts
        keys = ("requests", "placed", "backfilled", "preempted", "reclaimed", "pipelined",
                "stale", "jobs_changed", "ttl_deleted")  # fmt: skip
        return bool(self.errors) or any(c[k] for k in keys)

    def line(self) -> str:
        phases = " ".join(f"{k}={v * 1000:.1f}ms" for k, v in self.durations.items())
        c = self.counts
        text = (
            f"cycle {phases} queries={self.queries} db={self.db_seconds * 1000:.1f}ms"
            f" placed={c['placed']} preempted={c['preempted']}"
            f" reclaimed={c['reclaimed']} backfilled={c['backfilled']} pending={c['pending']}"
            f" stale={c['stale']} jobs_changed={c['jobs_changed']} ttl_deleted={c['ttl_deleted']}"
        )
        if self.errors:
            text += f" errors={','.join(self.errors)}"
        return text


class _PhaseMeter(QueryMeter):
    """Counts each query, and the time inside it, towards the phase that is running."""

    def __init__(self, report: CycleReport) -> None:
        super().__init__()
        self.report = report

    def count(self, seconds: float) -> None:
        timing = self.report.phases[self.report.current_phase]
        timing.queries += 1
        timing.db_seconds += seconds


def _phase(report: CycleReport, name: str, fn: Callable[[], Any], label: str = "") -> Any:
    """Run one unit of work as part of phase `name`; a failure is logged under `label`
    (default: the phase) and the cycle goes on, unless the database or Redis is down
    (scheduler/ops/faults.py): then the cycle ends there and the loop waits the outage out."""
    start = time.perf_counter()
    report.phases.setdefault(name, PhaseTiming())  # a phase added later is reported too
    report.current_phase = name
    try:
        return fn()
    except Exception as exc:
        if dependency_down(exc) or isinstance(exc, LostLeadership):
            raise  # no phase can run without it (or may, once another leads): the loop decides
        log.exception("scheduler phase %s failed", label or name)
        report.errors.append(label or name)
        return None
    finally:
        report.phases[name].seconds += time.perf_counter() - start


def _load() -> store.Loaded:
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:  # one consistent view of every table for the whole snapshot
            sql.repeatable_read()
        return store.load_snapshot()


def take_changes() -> bool:
    """Were rows the cycle reads written since the last call? Deletes the change marks
    (scheduler/migrations/0014_change_marks.py) in a statement of its own, before the cycle reads
    anything: a change committed before it is seen by this cycle, one committed after it
    leaves its mark for the next. True where the database keeps no marks (SQLite)."""
    return sql.take_change_marks()


def run_scheduler_cycle(
    config: SchedulingPolicy | None = None, housekeeping: bool = True, skip_unchanged: bool = False
) -> CycleReport:
    """One full cycle. Returns what it did and where its time went, for the log line, tests
    and benchmarks. Everything the cycle changed is published once, at its end.

    `housekeeping` False leaves out the checks that follow the clock rather than what
    happened (deadlines, silent nodes, orphaned tasks, TTLs): `run_scheduler` runs them once
    every HOUSEKEEPING_SECONDS instead of every cycle. With `skip_unchanged`, a cycle finding
    no row it reads written since the previous cycle skips placement, flows and job states
    (`report.skipped`): the same rows would give the same decisions. It still runs the
    housekeeping when asked; whatever that changes leaves marks, so the next cycle is full.
    Decisions that follow the clock alone (backfill windows, estimates) wait for the next full
    cycle, which `run_scheduler` runs at least every FULL_CYCLE_SECONDS."""
    report = CycleReport()
    started = time.perf_counter()
    # What the cycle writes is not news that should wake the loop again (cycle/wakeup.py).
    sql.quiet_session(True)
    try:
        with connection.execute_wrapper(_PhaseMeter(report)):
            report.current_phase = "load"
            changed = _phase(report, "load", take_changes, "changes")
            if skip_unchanged and changed is False:
                report.skipped = True
                if housekeeping:
                    with notify.batch():
                        _phase(report, "lifecycle", lifecycle.lose_orphaned_tasks, "orphans")
                        _clock_checks(report)
                return report
            with notify.batch():
                _cycle(report, config)
                _lifecycle(report, housekeeping)
                report.current_phase = "publish"
                publish_from = time.perf_counter()
            report.phases["publish"].seconds += time.perf_counter() - publish_from
    finally:
        report.total_seconds = time.perf_counter() - started
        _loud()
    return report


def _loud() -> None:
    """End the quiet before the connection goes back to the pool, where a request may get it
    next. A connection too broken for this is not pooled again."""
    try:
        sql.quiet_session(False)
    except Exception:  # noqa: BLE001 - an outage already ended the cycle; it is reported
        log.debug("could not end the cycle's quiet session", exc_info=True)


def _cycle(report: CycleReport, config: SchedulingPolicy | None) -> None:
    config = config or fairshare.scheduling_policy()
    # User requests first, so a cancel or suspend takes effect before placement. Array
    # elements asked to stop are cancelled in bulk first, not one transaction each.
    report.counts["requests"] = (
        _phase(report, "lifecycle", arrays.cancel_requested_elements, "arrays") or 0
    )
    report.counts["requests"] += (
        _phase(report, "lifecycle", lifecycle.process_requests, "requests") or 0
    )
    # Array limits (%K) after the requests, so a resumed element is held before placement.
    _phase(report, "lifecycle", arrays.release_held_elements, "arrays")
    loaded = _phase(report, "load", _load)
    if loaded is not None:
        _phase(report, "load", lambda: fairshare.fill(loaded.snapshot, config), "fairshare")
        result = _phase(report, "core", lambda: run_cycle(loaded.snapshot, config))
        if result is not None:
            report.core_timings = dict(result.timings)
            # Every waiting job's start estimate, set on its pending status for the commit.
            plan = _phase(report, "plan", lambda: planning.annotate(loaded, result, config))
            applied = _phase(report, "commit", lambda: store.apply_decisions(loaded, result))
            if applied is not None:
                report.counts["placed"] = applied.by_action.get("allocate", 0)
                report.counts["backfilled"] = applied.by_action.get("backfill", 0)
                report.counts["pipelined"] = sum(
                    n for a, n in applied.by_action.items() if a not in ("allocate", "backfill")
                )
                report.counts["stale"] = applied.stale
            report.counts["factors_written"] = (
                _phase(
                    report, "commit", lambda: fairshare.persist_factors(result, config), "factors"
                )
                or 0
            )
            for evict in result.evictions:
                report.counts["reclaimed" if evict.reason == "Reclaimed" else "preempted"] += 1
            report.counts["pending"] = len(result.pending)
            if plan is not None:
                report.counts["planned"] = plan.planned
                report.counts["plan_changed"] = (
                    _phase(report, "plan", lambda: planning.persist(loaded, plan)) or 0
                )


def _lifecycle(report: CycleReport, housekeeping: bool) -> None:
    """After placement: flows, job states from task states, and (with `housekeeping`) what
    the clock decides: deadlines, silent nodes, TTLs, and tasks whose node row was deleted."""
    _phase(report, "flows", flow_controller.reconcile_flows)
    if housekeeping:  # tasks whose node row was deleted
        _phase(report, "lifecycle", lifecycle.lose_orphaned_tasks, "orphans")
    report.counts["jobs_changed"] = _phase(report, "lifecycle", lifecycle.sync_jobs) or 0
    if housekeeping:
        _clock_checks(report)
    # A flow whose last job just finished is closed in this cycle, not the next one.
    _phase(report, "flows", flow_controller.reconcile_flows)
    _phase(report, "lifecycle", arrays.refresh_parents, "arrays")


def _clock_checks(report: CycleReport) -> None:
    """What the clock decides: deadlines, silent nodes, TTLs, old GPU samples, GPUs held
    idle, interactive GPU sessions idle."""
    _phase(report, "lifecycle", lifecycle.enforce_deadlines, "deadlines")
    _phase(report, "lifecycle", lifecycle.check_nodes, "nodes")
    ttl = _phase(report, "lifecycle", lifecycle.cleanup_ttl, "ttl") or 0
    ttl += (
        _phase(report, "lifecycle", lambda: flow_ttl.cleanup_flows(timezone.now()), "flow-ttl") or 0
    )
    report.counts["ttl_deleted"] = ttl
    _phase(report, "lifecycle", gpu_history.prune_if_due, "gpu-history")  # once a minute
    _phase(report, "lifecycle", gpu_idle.flag_if_due, "gpu-idle")  # every 10 s
    _phase(report, "lifecycle", idle_sessions.check_if_due, "idle-sessions")  # every 10 s
