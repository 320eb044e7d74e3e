"""manage.py run_scheduler: the scheduler loop, leader-elected."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from scheduler.heartbeat import record_cycle
from scheduler.leader import LeaderLock, leader_lock
from scheduler.loop import (
    FULL_CYCLE_SECONDS,
    HOUSEKEEPING_SECONDS,
    CycleReport,
    run_scheduler_cycle,
)
from scheduler.management.stopping import stop_on_signals

log = logging.getLogger("berth.scheduler")


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise CommandError(f"--interval: {value!r} is not a number") from None
    if not number > 0:
        raise CommandError(f"--interval: must be greater than 0, got {value}")
    return number


class Command(BaseCommand):
    help = (
        "Run the scheduler loop: each cycle carries out user requests, places jobs (enqueue,"
        " allocate, preempt, reclaim, backfill), reconciles flows and runs the lifecycle"
        " (job states and retries every cycle; deadlines, node health and TTL once a second)."
        " One leader at a time: on PostgreSQL an"
        " advisory lock, on SQLite a file lock; other instances wait as hot standbys."
        " SIGTERM finishes the current cycle and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one cycle and exit")
        parser.add_argument(
            "--interval",
            type=positive_float,
            default=None,
            help="seconds between cycle starts (default: BERTH_SCHEDULER_INTERVAL, 1.0)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        interval = options["interval"] or settings.BERTH_SCHEDULER_INTERVAL
        stop = stop_on_signals()
        lock = leader_lock()
        try:
            if options["once"]:
                if not lock.try_acquire():
                    raise CommandError("another scheduler is the leader; not running a cycle")
                report = _cycle_and_heartbeat(interval)
                self.stdout.write(report.line())
                return
            run_loop(lock, interval, stop)
        finally:
            lock.release()


def run_loop(
    lock: LeaderLock, interval: float, stop: threading.Event, log_idle: bool = True
) -> None:
    """Lead when the lock is ours, else wait as a standby; one cycle per interval, with the
    clock's checks (deadlines, silent nodes, TTLs) once every HOUSEKEEPING_SECONDS at most.
    A cycle that finds nothing changed since the previous one skips placement (running only
    the housekeeping if due); never the first one as leader, nor the one after a failure, nor
    when the last full cycle is FULL_CYCLE_SECONDS old.
    With `log_idle` off, only cycles that changed something are logged."""
    leading = False
    housekeeping_at = 0.0
    healthy = False  # the previous cycle as leader ran without a failure
    full_at = 0.0  # when a full cycle is due even if nothing changed
    while not stop.is_set():
        started = time.monotonic()
        if not leading:
            leading = lock.try_acquire()
            if leading:
                log.info("this scheduler is now the leader")
            else:
                stop.wait(interval)
                continue
        elif not lock.still_held():
            log.warning("lost the leader lock; standing by")
            leading = healthy = False
            continue
        housekeeping = started >= housekeeping_at
        if housekeeping:
            housekeeping_at = started + HOUSEKEEPING_SECONDS
        skip, healthy = healthy and started < full_at, False
        try:
            report = _cycle_and_heartbeat(interval, housekeeping, skip_unchanged=skip)
            healthy = not report.errors
            if not report.skipped:
                full_at = started + FULL_CYCLE_SECONDS
            if report.skipped and not report.busy:
                log.debug("cycle skipped: nothing changed")
            elif log_idle or report.busy:
                log.info(report.line())
        except Exception:  # a crash in one cycle is logged; the loop goes on
            log.exception("scheduler cycle failed")
        finally:
            close_old_connections()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def _cycle_and_heartbeat(
    interval: float, housekeeping: bool = True, skip_unchanged: bool = False
) -> CycleReport:
    """One cycle, then the heartbeat /healthz and /metrics read (last cycle, phase timings;
    a skipped cycle counts in the total only, so the phases describe cycles that ran)."""
    started = time.perf_counter()
    report = run_scheduler_cycle(housekeeping=housekeeping, skip_unchanged=skip_unchanged)
    try:
        phases = (
            {}
            if report.skipped
            else {name: timing.seconds for name, timing in report.phases.items()}
        )
        record_cycle(phases, time.perf_counter() - started, interval)
    except Exception:  # the heartbeat is for monitoring; a failure never stops scheduling
        log.exception("recording the scheduler heartbeat failed")
    return report
