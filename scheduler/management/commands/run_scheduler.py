"""manage.py run_scheduler: the scheduler loop, leader-elected."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from scheduler import notify
from scheduler.cycle.leader import (
    LeaderLock,
    LostLeadership,
    guard_transactions,
    lead_with,
    leader_lock,
    lost_lead,
    took_lead,
)
from scheduler.cycle.liveness import record_cycle
from scheduler.cycle.loop import (
    FULL_CYCLE_SECONDS,
    HOUSEKEEPING_SECONDS,
    CycleReport,
    run_scheduler_cycle,
)
from scheduler.cycle.wakeup import Wakeup
from scheduler.management.stopping import stop_on_signals
from scheduler.ops.faults import Outage, dependency_down, describe

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

        if not options["once"]:
            _refuse_unreachable_agents()
        interval = options["interval"] or settings.BERTH_SCHEDULER_INTERVAL
        stop = stop_on_signals()
        guard_transactions(settings.BERTH_LEADER_TIMEOUT)
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


def _refuse_unreachable_agents() -> None:
    """A loop apart from the web tier must reach the agents' leases held there: cancels,
    suspensions and preemptions kill tasks at once only if its wake-ups cross processes.
    `--once` (tests, scripts) and `manage.py up` (the loop inside the web process) need not."""
    problem = notify.cross_process_problem()
    if problem is not None:
        raise CommandError(
            f"run_scheduler runs apart from the web tier, but {problem}: its orders (start,"
            " cancel, suspend, preempt) would reach agents only at their next lease. Set"
            " REDIS_URL (the same Redis as the web tier), or run everything in one process"
            " with `./run up`."
        )


def run_loop(
    lock: LeaderLock, interval: float, stop: threading.Event, log_idle: bool = True
) -> None:
    """Lead when the lock is ours, else wait as a standby; one cycle per interval, sooner
    when news comes (a submission, a request, a task that started or ended:
    scheduler/cycle/wakeup.py), with the clock's checks (deadlines, silent nodes, TTLs) once
    every HOUSEKEEPING_SECONDS at most.
    A cycle that finds nothing changed since the previous one skips placement (running only
    the housekeeping if due); never the first one as leader, nor the one after a failure, nor
    when the last full cycle is FULL_CYCLE_SECONDS old.
    With `log_idle` off, only cycles that changed something are logged.

    A database that cannot be reached (a restart, a lost network, a full disk) never ends the
    loop: the leader steps down at once (its lock may already be gone with its connection),
    and the loop retries with capped backoff, logging once when the outage starts and once
    when it ends; whoever gets the lock next starts with a full cycle."""
    from django.conf import settings

    state = _LoopState()
    outage = Outage("database", log)
    wakeup = Wakeup(min(settings.BERTH_SCHEDULER_WAKE_GAP, interval))
    lead_with(lock)
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                wait = _one_turn(lock, interval, state, started, log_idle)
                outage.recovered()
            except Exception as exc:  # noqa: BLE001 - an outage is waited out, a bug is logged
                wait = _after_failure(exc, lock, state, outage, interval)
            finally:
                _close_connections()
            rest = max(0.0, interval - (time.monotonic() - started))
            if wait is None and state.leading:
                wakeup.wait(rest, stop)
            else:
                wakeup.pause()
                stop.wait(rest if wait is None else wait)
    finally:
        wakeup.close()
        lead_with(None)


def _after_failure(
    exc: Exception, lock: LeaderLock, state: _LoopState, outage: Outage, interval: float
) -> float:
    """What a failed turn means, and how long to wait before the next one."""
    if isinstance(exc, LostLeadership):
        log.warning("stepping down as leader: %s", exc)
        state.step_down(lock)
        return 0.0
    if dependency_down(exc):
        if state.leading:
            log.warning("stepping down as leader: %s", describe(exc))
        state.step_down(lock)
        return outage.failed(exc)
    log.exception("scheduler turn failed")
    return interval


@dataclass
class _LoopState:
    leading: bool = False
    housekeeping_at: float = 0.0
    healthy: bool = False  # the previous cycle as leader ran without a failure
    full_at: float = 0.0  # when a full cycle is due even if nothing changed

    def step_down(self, lock: LeaderLock) -> None:
        self.leading = self.healthy = False
        lost_lead()
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - a lock on a dead connection is gone with it
            log.debug("releasing the leader lock failed", exc_info=True)


def _one_turn(
    lock: LeaderLock, interval: float, state: _LoopState, started: float, log_idle: bool
) -> float | None:
    """Take or check the lead, then run one cycle as leader. Returns how long to wait
    before the next turn (None: the rest of the interval). A database outage raises."""
    if not state.leading:
        state.leading = lock.try_acquire()
        if not state.leading:
            return interval
        took_lead()
        log.info("this scheduler is now the leader")
    elif not lock.still_held():
        log.warning("lost the leader lock; standing by")
        state.step_down(lock)
        return 0.0
    housekeeping = started >= state.housekeeping_at
    if housekeeping:
        state.housekeeping_at = started + HOUSEKEEPING_SECONDS
    skip, state.healthy = state.healthy and started < state.full_at, False
    try:
        report = _cycle_and_heartbeat(interval, housekeeping, skip_unchanged=skip)
    except Exception as exc:  # a crash in one cycle is logged; the loop goes on
        if dependency_down(exc) or isinstance(exc, LostLeadership):
            raise
        log.exception("scheduler cycle failed")
        return None
    state.healthy = not report.errors
    if not report.skipped:
        state.full_at = started + FULL_CYCLE_SECONDS
    if report.skipped and not report.busy:
        log.debug("cycle skipped: nothing changed")
    elif log_idle or report.busy:
        log.info(report.line())
    return None


def _close_connections() -> None:
    """Hand back this thread's connection if it broke or aged; a dead server may make even
    that fail, which the next turn finds out again."""
    try:
        close_old_connections()
    except Exception:  # noqa: BLE001
        log.debug("closing the database connection failed", exc_info=True)


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
    except Exception as exc:  # the heartbeat is for monitoring; a failure never stops scheduling
        if dependency_down(exc):
            raise
        log.exception("recording the scheduler heartbeat failed")
    return report
