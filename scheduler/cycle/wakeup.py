"""What the scheduler loop waits on between cycles: the end of its interval, or news.

A cycle runs every BERTH_SCHEDULER_INTERVAL seconds; a submission, a user's request, a task
that started or ended, or a node that came or changed its state wakes the loop sooner, so a
job on an idle cluster is placed, and seen Running, in a fraction of a second instead of up
to an interval each (`berth shell` waits for both). Wake-ups never start cycles closer than
BERTH_SCHEDULER_WAKE_GAP seconds apart, so a stream of submissions costs a few cycles a
second, not one per submission.

News reaches the loop two ways:
- on PostgreSQL, from any process (the web tier, agents' reports): triggers
  (scheduler/migrations/0025_wake_scheduler.py) send a notification on the channel
  `sql.WAKE_CHANNEL` when such a write commits, and the loop listens on a connection of its
  own. A transaction that rolls back sends nothing; a notification that finds no listener
  is dropped, which costs nothing but the wait for the interval.
- inside its own process, where the database sends no notifications (SQLite: `./run up` on
  its embedded defaults), through `notify`'s change registry: any change another thread of
  the process commits.
The loop's own writes wake it neither way: its session is quiet while it runs a cycle
(scheduler/cycle/loop.py, `sql.quiet_session`: the triggers' WHEN clauses skip it), and the
changes its own thread publishes are ignored; its next cycle comes at the interval, as
before. If the listening connection fails (a database restart), the loop waits out its
interval as before and listens again on a fresh connection later; nothing else changes.
Whenever a listener is opened (the first wait as leader, again after a failure or a spell as
standby), the wait counts as news: a commit between the cycle's reads and the LISTEN was
announced to nobody, and the loop must not wait an interval for it.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic
from typing import Any

import psycopg
from django.db import connection

from scheduler import notify, sql

log = logging.getLogger("berth.scheduler")

SLICE_SECONDS = 0.05  # how often a wait looks at the stop flag and the in-process news
RECONNECT_SECONDS = 5.0  # after a failed listening connection, the next try waits this long


class Wakeup:
    """Made once per loop, in the loop's thread (changes published from that thread are the
    loop's own). `in_process`: hear news through `notify` instead of PostgreSQL (default:
    where the database is not PostgreSQL)."""

    def __init__(self, gap: float, in_process: bool | None = None) -> None:
        self.gap = max(0.0, gap)
        self._news = threading.Event()
        self._thread = threading.current_thread()
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_after = 0.0  # monotonic time before which no new listener is opened
        self._in_process = connection.vendor != "postgresql" if in_process is None else in_process
        if self._in_process:
            notify.connect(self._heard)

    def close(self) -> None:
        if self._in_process:
            notify.disconnect(self._heard)
        self._drop_listener()

    def pause(self) -> None:
        """Stop listening while the loop does not lead (a standby): notifications nobody
        reads would pile up on the server for this session. The next wait listens again."""
        if self._listener is not None:
            self._drop_listener(retry_after=0.0)

    # --- news -------------------------------------------------------------------------

    def _heard(self, jobs: set[int], flows: set[int], nodes: set[int]) -> None:
        """A change committed in this process: news unless the loop itself made it."""
        if threading.current_thread() is not self._thread:
            self._news.set()

    # --- waiting ----------------------------------------------------------------------

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Wait up to `seconds`; return True early (no sooner than the gap) when there is
        news, False when the time ran out or `stop` was set."""
        began = monotonic()
        deadline = began + max(0.0, seconds)
        earliest = began + min(self.gap, max(0.0, seconds))
        listener = self._listening()
        while not stop.is_set():
            now = monotonic()
            if now >= deadline or (self._news.is_set() and now >= earliest):
                return self._taken(listener)
            pause = min(SLICE_SECONDS, deadline - now)
            if self._news.is_set():
                stop.wait(min(pause, earliest - now))
            elif listener is not None:
                listener = self._listen(listener, pause)
            else:
                stop.wait(pause)
        return False

    def _taken(self, listener: psycopg.Connection[Any] | None) -> bool:
        """Whether there was news; all of it so far is taken, since the cycle about to run
        reads what it announced (a burst of commits wakes the loop once, not once each)."""
        if listener is not None:
            self._listen(listener, 0.0)
        news = self._news.is_set()
        self._news.clear()
        return news

    def _listening(self) -> psycopg.Connection[Any] | None:
        """The listening connection, opened when missing (not more often than every
        RECONNECT_SECONDS after a failure); None where the database sends no notifications."""
        if self._listener is not None and not self._listener.closed:
            return self._listener
        if self._in_process or monotonic() < self._listen_after:
            return None
        try:
            self._listener = sql.connect_apart(
                connection.settings_dict, "berth-scheduler-wakeup", timeout=RECONNECT_SECONDS
            )
            self._listener.execute(sql.LISTEN_WAKE)
        except psycopg.Error as exc:
            log.debug("not listening for wake-ups: %s", exc)
            self._drop_listener()
            return None
        # What committed after the last cycle read the database but before this listener
        # was there sent its notification to nobody: a fresh listener counts as news, so
        # the next cycle reads it now (after the gap), not at the end of the interval.
        self._news.set()
        return self._listener

    def _listen(self, listener: psycopg.Connection[Any], seconds: float) -> Any:
        """Take the notifications that come within `seconds` (0: those already here); the
        listener, or None if it failed (the rest of this wait is a plain one)."""
        try:
            for _note in listener.notifies(timeout=seconds, stop_after=1 if seconds else None):
                self._news.set()
        except psycopg.Error as exc:
            log.debug("stopped listening for wake-ups: %s", exc)
            self._drop_listener()
            return None
        return listener

    def _drop_listener(self, retry_after: float | None = None) -> None:
        listener, self._listener = self._listener, None
        self._listen_after = monotonic() + (
            RECONNECT_SECONDS if retry_after is None else retry_after
        )
        if listener is not None:
            try:
                listener.close()
            except psycopg.Error:
                pass
