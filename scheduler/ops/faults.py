"""A dependency that is down is a state to wait out, not a crash.

`dependency_down(exc)` says whether an exception means PostgreSQL or Redis could not be
reached or could not write (a restart, a lost network, a full disk), as opposed to a bug or
a bad statement. Long-lived processes (the scheduler loop, the agents' held leases, the web
tier's 503 path in berth/web/overload.py) retry those with an `Outage`: capped exponential backoff
with jitter, and one log line when the outage starts and one when it ends, never one per
attempt (docs/operations.md, "What happens when X fails").
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import psycopg
import redis
from django.db import utils as db_utils
from psycopg_pool import PoolTimeout

# SQLSTATEs that mean "the server cannot serve us now", not "this statement is wrong":
# class 08 (connection exceptions), operator intervention (a shutdown or restart), and
# insufficient resources (disk full, out of memory, too many connections).
OUTAGE_STATES = {"57P01", "57P02", "57P03", "53000", "53100", "53200", "53300", "58030"}
DISK_FULL = "53100"
READ_ONLY = "25006"  # a standby promoted late, or default_transaction_read_only after a failover
# A transaction rolled back because it lost to a concurrent one (a deadlock PostgreSQL broke,
# a serialization failure): nothing it wrote stays, and the same request may simply be retried.
CONFLICT_STATES = {"40P01", "40001"}


def _chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and what it wraps (Django re-raises driver errors as its own)."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def database_down(exc: BaseException | None) -> bool:
    """The database could not be reached, refused us, or cannot write."""
    for item in _chain(exc):
        if isinstance(item, PoolTimeout | psycopg.InterfaceError | db_utils.InterfaceError):
            return True
        if isinstance(item, psycopg.OperationalError):
            state = _sqlstate(item)
            # No SQLSTATE: the connection itself failed (refused, reset, closed mid-query).
            if state is None or state.startswith("08") or state in OUTAGE_STATES:
                return True
        if isinstance(item, psycopg.Error) and _sqlstate(item) == READ_ONLY:
            return True
    return False


def database_conflict(exc: BaseException | None) -> bool:
    """The transaction lost a race PostgreSQL broke (deadlock, serialization): retry it."""
    return any(_sqlstate(item) in CONFLICT_STATES for item in _chain(exc))


def database_cannot_write(exc: BaseException | None) -> bool:
    """The database is up but out of disk (or read-only): new work must wait."""
    return any(_sqlstate(item) in (DISK_FULL, READ_ONLY) for item in _chain(exc))


def redis_down(exc: BaseException | None) -> bool:
    return any(
        isinstance(
            item, redis.ConnectionError | redis.TimeoutError | ConnectionError | TimeoutError
        )
        for item in _chain(exc)
    )


def dependency_down(exc: BaseException | None) -> bool:
    return database_down(exc) or redis_down(exc)


def describe(exc: BaseException) -> str:
    """One line for the log: which dependency, and the driver's first line."""
    what = "database" if database_down(exc) else "redis" if redis_down(exc) else "dependency"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{what}: {first[:200]}"


class Outage:
    """Backoff and logging for one dependency as one process sees it.

    `failed(exc)` returns how long to wait before the next attempt (between half and all of
    `base * 2**n`, capped at `cap`) and logs a warning only for the first failure of an
    outage; `recovered()` logs once that it is over and how long it lasted."""

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        base: float = 0.25,
        cap: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.what, self.log, self.base, self.cap = what, log, base, cap
        self.clock, self.rand = clock, rand
        self.failures = 0
        self.since: float | None = None

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> float:
        if self.since is None:
            self.since = self.clock()
            self.log.warning("%s unavailable (%s); retrying with backoff", self.what, describe(exc))
        self.failures += 1
        ceiling = min(self.cap, self.base * 2 ** min(self.failures - 1, 30))
        return ceiling * (0.5 + 0.5 * self.rand())

    def recovered(self) -> None:
        if self.since is not None:
            self.log.warning(
                "%s back after %.1fs (%d failed attempts)",
                self.what,
                self.clock() - self.since,
                self.failures,
            )
        self.since = None
        self.failures = 0
