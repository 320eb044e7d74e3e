"""The scheduler cycle: snapshot -> core -> decisions -> commit -> flows -> lifecycle.

`run_cycle_once` is one unit of work, called by `manage.py run_scheduler`, by `manage.py up`
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

from scheduler import arrays, lifecycle, notify, store
from scheduler.core.cycle import run_cycle
from scheduler.core.model import SchedulerConfig

log = logging.getLogger("berth.scheduler")


@dataclass
class CycleReport:
    durations: dict[str, float] = field(default_factory=dict)
    core_timings: dict[str, float] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

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
            f"cycle {phases} placed={c['placed']} preempted={c['preempted']}"
            f" reclaimed={c['reclaimed']} backfilled={c['backfilled']} pending={c['pending']}"
            f" stale={c['stale']} jobs_changed={c['jobs_changed']} ttl_deleted={c['ttl_deleted']}"
        )
        if self.errors:
            text += f" errors={','.join(self.errors)}"
        return text


def _phase(report: CycleReport, name: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return fn()
    except Exception:
        log.exception("scheduler phase %s failed", name)
        report.errors.append(name)
        return None
    finally:
        report.durations[name] = report.durations.get(name, 0.0) + time.perf_counter() - start


def _load() -> store.Loaded:
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            # One consistent view of every table for the whole snapshot.
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return store.load_snapshot()


def _flows_reconcile() -> Any:
    try:
        from scheduler.flows.controller import reconcile_flows
    except ImportError:
        return None
    return reconcile_flows()


def _flows_ttl() -> Any:
    try:
        from scheduler.flows.ttl import cleanup_flows
    except ImportError:
        return 0
    return cleanup_flows(timezone.now())


def run_cycle_once(config: SchedulerConfig | None = None) -> CycleReport:
    """One full cycle. Returns what it did, for the log line and for tests. Everything the
    cycle changed is published once, at its end."""
    report = CycleReport()
    with notify.batch():
        _cycle(report, config)
    return report


def _cycle(report: CycleReport, config: SchedulerConfig | None) -> None:
    config = config or SchedulerConfig()
    # User requests first, so a cancel or suspend takes effect before placement. Array
    # elements asked to stop are cancelled in bulk first, not one transaction each.
    report.counts["requests"] = _phase(report, "arrays", arrays.cancel_requested_elements) or 0
    report.counts["requests"] += _phase(report, "requests", lifecycle.process_requests) or 0
    # Array limits (%K) after the requests, so a resumed element is held before placement.
    _phase(report, "arrays", arrays.release_held_elements)
    loaded = _phase(report, "snapshot", _load)
    if loaded is not None:
        result = _phase(report, "schedule", lambda: run_cycle(loaded.snapshot, config))
        if result is not None:
            report.core_timings = dict(result.timings)
            applied = _phase(report, "commit", lambda: store.apply_decisions(loaded, result))
            if applied is not None:
                report.counts["placed"] = applied.by_action.get("allocate", 0)
                report.counts["backfilled"] = applied.by_action.get("backfill", 0)
                report.counts["pipelined"] = sum(
                    n for a, n in applied.by_action.items() if a not in ("allocate", "backfill")
                )
                report.counts["stale"] = applied.stale
            for evict in result.evictions:
                report.counts["reclaimed" if evict.reason == "Reclaimed" else "preempted"] += 1
            report.counts["pending"] = len(result.pending)
    _phase(report, "flows", _flows_reconcile)
    _phase(report, "lifecycle", lifecycle.lose_orphaned_tasks)  # their node row was deleted
    report.counts["jobs_changed"] = _phase(report, "lifecycle", lifecycle.sync_jobs) or 0
    _phase(report, "lifecycle", lifecycle.enforce_deadlines)
    _phase(report, "lifecycle", lifecycle.check_nodes)
    report.counts["ttl_deleted"] = _phase(report, "ttl", lifecycle.cleanup_ttl) or 0
    report.counts["ttl_deleted"] += _phase(report, "ttl", _flows_ttl) or 0
    # A flow whose last job just finished is closed in this cycle, not the next one.
    _phase(report, "flows", _flows_reconcile)
    _phase(report, "arrays", arrays.refresh_parents)
