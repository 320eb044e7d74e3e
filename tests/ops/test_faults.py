"""A dependency that is down is told apart from a bug (scheduler/ops/faults.py), waited out with
capped backoff and logged once per outage; the scheduler loop survives it (the outage of
issue #20: a PostgreSQL restart killed `run_scheduler` from its leader lock)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
import redis
from django.db import utils as db_utils
from psycopg import errors
from psycopg_pool import PoolTimeout

from scheduler.management.commands import run_scheduler
from scheduler.ops import faults


def wrapped(exc: BaseException) -> BaseException:
    """As Django raises it: its own class, the driver's error as the cause."""
    outer = db_utils.OperationalError(str(exc))
    outer.__cause__ = exc
    return outer


@pytest.mark.parametrize(
    ("exc", "down", "cannot_write"),
    [
        (psycopg.OperationalError("connection refused"), True, False),  # no SQLSTATE
        (errors.AdminShutdown("terminating connection"), True, False),  # 57P01, a restart
        (errors.CannotConnectNow("the database system is starting up"), True, False),
        (errors.DiskFull("could not extend file"), True, True),  # 53100
        (errors.ReadOnlySqlTransaction("read-only"), True, True),  # after a failover
        (wrapped(errors.AdminShutdown("x")), True, False),
        (PoolTimeout("no connection in 2 s"), True, False),
        (psycopg.InterfaceError("the connection is closed"), True, False),
        (errors.QueryCanceled("statement timeout"), False, False),  # our query, not an outage
        (errors.DeadlockDetected("deadlock"), False, False),
        (errors.UniqueViolation("duplicate"), False, False),
        (ValueError("a bug"), False, False),
    ],
)
def test_an_outage_is_told_apart_from_a_bug(exc: BaseException, down: bool,
                                            cannot_write: bool) -> None:  # fmt: skip
    assert faults.database_down(exc) is down
    assert faults.database_cannot_write(exc) is cannot_write
    assert faults.dependency_down(exc) is down


def test_redis_gone_is_an_outage_too() -> None:
    assert faults.redis_down(redis.ConnectionError("Connection refused"))
    assert faults.dependency_down(ConnectionRefusedError(111, "refused"))
    assert not faults.redis_down(redis.ResponseError("WRONGTYPE"))


def test_an_outage_backs_off_capped_and_is_logged_once(caplog: Any) -> None:
    now = [0.0]
    outage = faults.Outage("database", logging.getLogger("test.outage"), base=0.5, cap=8.0,
                           clock=lambda: now[0], rand=lambda: 1.0)  # fmt: skip
    caplog.set_level(logging.WARNING, "test.outage")
    waits = [outage.failed(errors.AdminShutdown("gone")) for _ in range(8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    now[0] = 31.5
    outage.recovered()
    outage.recovered()  # nothing to say: it is over
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("database unavailable (database: gone)")
    assert lines[1] == "database back after 31.5s (8 failed attempts)"
    assert outage.failed(errors.AdminShutdown("again")) == 0.5  # a new outage starts afresh


class FlakyLock:
    """A leader lock whose database goes away for `down` attempts, as in a restart."""

    def __init__(self, down: int, stop: threading.Event, turns: int) -> None:
        self.down, self.stop, self.turns = down, stop, turns
        self.attempts = self.released = 0

    def try_acquire(self) -> bool:
        self.attempts += 1
        if self.attempts >= self.turns:
            self.stop.set()
        if self.attempts <= self.down:
            raise errors.CannotConnectNow("the database system is starting up")
        return True

    def still_held(self) -> bool:
        return True

    def release(self) -> None:
        self.released += 1


def test_the_loop_waits_out_a_database_that_is_down_and_leads_again(
    monkeypatch: Any, caplog: Any
) -> None:
    stop = threading.Event()
    lock = FlakyLock(down=3, stop=stop, turns=4)
    cycles: list[bool] = []

    def cycle(interval: float, housekeeping: bool, skip_unchanged: bool = False) -> Any:
        cycles.append(skip_unchanged)
        stop.set()
        return run_scheduler.CycleReport()

    monkeypatch.setattr(run_scheduler, "_cycle_and_heartbeat", cycle)
    monkeypatch.setattr(faults.Outage, "failed", lambda self, exc: _failed(self, exc))
    caplog.set_level(logging.INFO, "berth.scheduler")
    run_scheduler.run_loop(lock, 0.01, stop)  # type: ignore[arg-type]
    assert lock.attempts == 4  # three refusals waited out, then the lock
    assert cycles == [False]  # and a full cycle as the new leader
    outage_lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outage_lines) == 1  # once per outage, not per attempt
    assert any("back after" in r.getMessage() for r in caplog.records)


_real_failed = faults.Outage.failed


def _failed(outage: faults.Outage, exc: BaseException) -> float:
    _real_failed(outage, exc)
    return 0.0  # no real waiting in a test


def test_a_leader_whose_cycle_meets_an_outage_steps_down(monkeypatch: Any) -> None:
    stop = threading.Event()
    lock = FlakyLock(down=0, stop=stop, turns=3)
    calls: list[int] = []

    def cycle(interval: float, housekeeping: bool, skip_unchanged: bool = False) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise wrapped(psycopg.OperationalError("server closed the connection unexpectedly"))
        stop.set()
        return run_scheduler.CycleReport()

    monkeypatch.setattr(run_scheduler, "_cycle_and_heartbeat", cycle)
    monkeypatch.setattr(faults.Outage, "failed", lambda self, exc: _failed(self, exc))
    run_scheduler.run_loop(lock, 0.01, stop)  # type: ignore[arg-type]
    assert lock.released == 1  # it let go of the lead at once
    assert lock.attempts == 2  # and took it again to run the next cycle
    assert len(calls) == 2


def test_a_bug_in_one_turn_is_logged_and_the_loop_goes_on(monkeypatch: Any, caplog: Any) -> None:
    stop = threading.Event()

    class BuggyLock(FlakyLock):
        def try_acquire(self) -> bool:
            self.attempts += 1
            if self.attempts == 1:
                raise KeyError("a bug")
            self.stop.set()
            return False

    lock = BuggyLock(down=0, stop=stop, turns=99)
    run_scheduler.run_loop(lock, 0.01, stop)  # type: ignore[arg-type]
    assert lock.attempts == 2
    assert "scheduler turn failed" in caplog.text


def test_what_up_runs_in_its_threads_is_started_again_after_a_failure(caplog: Any) -> None:
    from scheduler.management.stopping import supervise

    stop = threading.Event()
    runs: list[int] = []

    def work(stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise errors.AdminShutdown("the loop died")  # as run_scheduler did on a restart
        if len(runs) == 2:
            return  # ended by itself: also started again
        stop.set()

    supervise("the scheduler loop", work, stop, first_wait=0.01)
    assert len(runs) == 3
    assert "the scheduler loop stopped with an error" in caplog.text
    assert "the scheduler loop stopped by itself" in caplog.text
