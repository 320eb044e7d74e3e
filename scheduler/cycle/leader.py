"""One scheduler leads at a time; the others wait as hot standbys.

PostgreSQL: a session-level advisory lock held on a dedicated connection (not Django's, which
may be closed between cycles and would drop the lock). If the leader dies its connection
closes, the lock is freed and a standby takes over. The lock is a lease, not a possession: the
session runs with `idle_session_timeout` = BERTH_LEADER_TIMEOUT and a thread of the leader
renews it (a trivial query) three times per timeout, so a leader that is frozen (SIGSTOP, a
hung VM) or cut off from the database loses its session, and with it the lock, within the
timeout, and a standby takes over. A leader that wakes up after that must not write what it
decided before: `fence()` runs inside the cycle's commit transaction and refuses to commit
unless the lock is still held by this leader's own session (scheduler/cycle/store.py).
SQLite: an exclusive file lock beside the database file, so a second scheduler on the same
machine waits.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from time import monotonic
from typing import IO, Any, Protocol

import psycopg
from django.db import connection

from scheduler import sql

# Berth's advisory lock key: "berth" in ASCII, so it never collides with another app's by chance.
LOCK_KEY = 0x6265727468
log = logging.getLogger("berth.scheduler")


class LostLeadership(Exception):
    """This scheduler no longer holds the lock: what it decided must not be written."""


class LeaderLock(Protocol):
    def try_acquire(self) -> bool: ...
    def still_held(self) -> bool: ...
    def release(self) -> None: ...


# The lock the running loop leads with, for `fence()` (one loop per process), and since when
# (time.monotonic()) it has led.
_current: list[LeaderLock] = []
_led_since: list[float] = []


def lead_with(lock: LeaderLock | None) -> None:
    """Make `lock` the one `fence()` checks (None: no loop, nothing to check)."""
    _current[:] = [lock] if lock is not None else []
    _led_since.clear()


def took_lead() -> None:
    _led_since[:] = [monotonic()]


def lost_lead() -> None:
    _led_since.clear()


def lead_age() -> float | None:
    """Seconds this process's loop has led without a break; None outside a loop (a cycle run
    on its own: tests, `--once`). A new leader, or one back after an outage, could not hear
    the agents before: scheduler/lifecycle/nodes.py judges no node's silence until it has
    led for a whole heartbeat timeout."""
    return monotonic() - _led_since[0] if _led_since else None


def fence() -> None:
    """Inside a transaction on Django's connection: raise LostLeadership unless the lock
    the loop leads with is still held by its own session. Outside a loop (tests, `--once`
    before `lead_with`) there is nothing to check."""
    if _current and isinstance(_current[0], PostgresLeaderLock):
        _current[0].fence()


class PostgresLeaderLock:
    def __init__(self, settings_dict: dict[str, Any], timeout: float = 15.0) -> None:
        self._settings = settings_dict
        self._timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()

    def _connect(self) -> psycopg.Connection[Any]:
        # A session the leader stops renewing (frozen, cut off) is ended by the server.
        return sql.connect_apart(
            self._settings,
            "berth-scheduler-leader",
            self._timeout,
            options=f"-c idle_session_timeout={int(self._timeout * 1000)}",
        )

    def try_acquire(self) -> bool:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        row = self._conn.execute(sql.LEADER_TRY_LOCK, (LOCK_KEY,)).fetchone()
        held = bool(row and row[0])
        if held and row is not None:
            self._pid = int(row[1])
            self._start_renewing()
        return held

    def _start_renewing(self) -> None:
        if (
            self._renewer is not None
            and self._renewer.is_alive()
            and not self._stop_renewing.is_set()
        ):
            return  # (one told to stop may not have noticed yet: a new one starts)
        self._stop_renewing = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew, args=(self._stop_renewing,), name="leader-lease", daemon=True
        )
        self._renewer.start()

    def _renew(self, stop: threading.Event) -> None:
        """Keep the session busy three times per timeout while we lead."""
        while not stop.wait(self._timeout / 3):
            conn = self._conn
            if conn is None or conn.closed:
                return
            try:
                conn.execute(sql.PING)
            except psycopg.Error:
                return  # the loop finds out through still_held() and steps down

    def fence(self) -> None:
        if self._pid is None:
            raise LostLeadership("this scheduler does not hold the leader lock")
        if not sql.leader_lock_granted(self._pid, LOCK_KEY & 0xFFFFFFFF):
            raise LostLeadership("the leader lock passed to another scheduler")

    def still_held(self) -> bool:
        if self._conn is None or self._conn.closed:
            return False
        try:
            row = self._conn.execute(sql.LEADER_LOCK_HELD, (LOCK_KEY & 0xFFFFFFFF,)).fetchone()
        except psycopg.Error:
            self.release()
            return False
        return bool(row and row[0])

    def release(self) -> None:
        self._stop_renewing.set()
        self._pid = None
        if self._conn is not None and not self._conn.closed:
            # Unlock explicitly: the server frees a closed session's locks only once it notices
            # the disconnect, and a standby asking at once would still find the lock held. (A
            # leader that dies frees it that way, a moment later.)
            try:
                self._conn.execute(sql.LEADER_UNLOCK, (LOCK_KEY,))
            except psycopg.Error:
                pass
            self._conn.close()
        self._conn = None


class FileLeaderLock:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[str] | None = None

    def try_acquire(self) -> bool:
        if self._file is not None:
            return True
        self._path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self._path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return True

    def still_held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def guard_transactions(timeout: float) -> None:
    """In the scheduler's process: PostgreSQL ends any transaction left idle half a lock
    timeout (the process frozen between two statements), so a leader frozen inside its
    commit, after `fence()`, can neither commit once another leads (its lock's session lasts
    at least two thirds of a timeout frozen) nor hold row locks the new leader waits for."""
    from django.db import connection as default
    from django.db.backends.signals import connection_created

    milliseconds = max(1000, int(timeout * 500))

    def limit(sender: Any, connection: Any, **kwargs: Any) -> None:
        sql.limit_idle_transactions(connection, milliseconds)

    connection_created.connect(limit, weak=False, dispatch_uid="berth-leader-transactions")
    if default.connection is not None:
        limit(None, default)


def leader_lock() -> LeaderLock:
    settings_dict = connection.settings_dict
    if connection.vendor == "postgresql":
        from django.conf import settings

        return PostgresLeaderLock(dict(settings_dict), timeout=settings.BERTH_LEADER_TIMEOUT)
    name = str(settings_dict["NAME"])
    if name == ":memory:" or name.startswith("file:"):
        from django.conf import settings

        return FileLeaderLock(Path(settings.DATA_DIR) / "scheduler.lock")
    return FileLeaderLock(Path(name + ".scheduler.lock"))
