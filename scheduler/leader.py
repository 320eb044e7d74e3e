"""One scheduler leads at a time; the others wait as hot standbys.

PostgreSQL: a session-level advisory lock held on a dedicated connection (not Django's, which
may be closed between cycles and would drop the lock). If the leader dies its connection
closes, the lock is freed and a standby takes over. SQLite: an exclusive file lock beside the
database file, so a second scheduler on the same machine waits.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any, Protocol

import psycopg
from django.db import connection

# Berth's advisory lock key: "berth" in ASCII, so it never collides with another app's by chance.
LOCK_KEY = 0x6265727468


class LeaderLock(Protocol):
    def try_acquire(self) -> bool: ...
    def still_held(self) -> bool: ...
    def release(self) -> None: ...


class PostgresLeaderLock:
    def __init__(self, settings_dict: dict[str, Any]) -> None:
        self._settings = settings_dict
        self._conn: psycopg.Connection[Any] | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        s = self._settings
        return psycopg.connect(
            dbname=s["NAME"],
            user=s.get("USER") or None,
            password=s.get("PASSWORD") or None,
            host=s.get("HOST") or None,
            port=s.get("PORT") or None,
            autocommit=True,
            application_name="berth-scheduler-leader",
        )

    def try_acquire(self) -> bool:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
        return bool(row and row[0])

    def still_held(self) -> bool:
        if self._conn is None or self._conn.closed:
            return False
        try:
            row = self._conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid() AND objid = %s",
                (LOCK_KEY & 0xFFFFFFFF,),
            ).fetchone()
        except psycopg.Error:
            self.release()
            return False
        return bool(row and row[0])

    def release(self) -> None:
        if self._conn is not None and not self._conn.closed:
            # Unlock explicitly: the server frees a closed session's locks only once it notices
            # the disconnect, and a standby asking at once would still find the lock held. (A
            # leader that dies frees it that way, a moment later.)
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
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


def leader_lock() -> LeaderLock:
    settings_dict = connection.settings_dict
    if connection.vendor == "postgresql":
        return PostgresLeaderLock(dict(settings_dict))
    name = str(settings_dict["NAME"])
    if name == ":memory:" or name.startswith("file:"):
        from django.conf import settings

        return FileLeaderLock(Path(settings.DATA_DIR) / "scheduler.lock")
    return FileLeaderLock(Path(name + ".scheduler.lock"))
