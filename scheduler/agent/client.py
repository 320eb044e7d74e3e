"""The HTTP client of the agent protocol, with back-pressure handled in one place.

Django-free: the agent (`python -m scheduler.agent`), the simulated agent and the bench
scripts share it. One `Http` object is one keep-alive connection used by one thread at a time.

A request either succeeds (a JSON object), or raises:
- `Unavailable`: the server asked us to come back later (429, 503, and 502/504 from a proxy,
  with its `Retry-After` when it gave one) or could not be reached. Callers wait
  `Backoff.delay(exc.retry_after)` and try again; nothing is lost because every request of
  the protocol may be repeated (reports are full state, log chunks are placed by offset).
- `ServerError`: any other HTTP error; retrying the same request will not help.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from scheduler.agent.wire import PROTOCOL as PROTOCOL
from scheduler.agent.wire import PROTOCOL_HEADER as PROTOCOL_HEADER

RETRY_STATUSES = {429, 502, 503, 504}
MAX_RETRY_AFTER = 300.0  # a server's Retry-After is honoured up to this many seconds


class ServerError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class Unavailable(Exception):
    """Come back later: `retry_after` is the server's wish in seconds, None if it gave none."""

    def __init__(self, reason: str, retry_after: float | None = None, status: int = 0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.status = status


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or
    unreadable. Bounded, so a hostile or broken server cannot park an agent for ever."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


class Backoff:
    """Bounded exponential backoff with jitter.

    Without a Retry-After the n-th consecutive failure waits between half and all of
    `base * 2**n` (capped at `cap`); with one it waits that long plus up to 20% more, so that
    agents refused together do not come back together.
    """

    def __init__(self, base: float = 0.5, cap: float = 30.0,
                 rand: Callable[[], float] = random.random) -> None:  # fmt: skip
        self.base, self.cap, self.rand = base, cap, rand
        self.failures = 0

    def delay(self, retry_after: float | None = None) -> float:
        step = min(self.cap, self.base * 2**self.failures)
        self.failures = min(self.failures + 1, 32)
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER) * (1.0 + 0.2 * self.rand())
        return step / 2 + step / 2 * self.rand()

    def reset(self) -> None:
        self.failures = 0


class Http:
    """One keep-alive HTTP/1.1 connection to the server, for one thread at a time."""

    def __init__(self, server: str, timeout: float = 10.0) -> None:
        parts = urlsplit(server.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s):// URL, got {server!r}")
        self.scheme, self.netloc, self.prefix = parts.scheme, parts.netloc, parts.path
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # guards _conn against abort() from another thread
        self._aborted = False

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            reused = self._conn is not None
            if self._conn is None:
                cls = (http.client.HTTPSConnection if self.scheme == "https"
                       else http.client.HTTPConnection)  # fmt: skip
                self._conn = cls(self.netloc, timeout=timeout)
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
            return self._conn, reused

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def abort(self) -> None:
        """From another thread: end a request that is waiting (a held lease) at once, and
        refuse any further one (this client is being shut down)."""
        with self._lock:
            self._aborted = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def post(self, path: str, body: dict[str, Any], auth: str = "",
             timeout: float | None = None) -> dict[str, Any]:  # fmt: skip
        """POST `body` as JSON to PREFIX/api/v1/agent/`path`; one attempt (plus one silent
        retry when a kept-alive connection turns out to have been closed by the server)."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", PROTOCOL_HEADER: str(PROTOCOL),
                   "Accept": "application/json"}  # fmt: skip
        if auth:
            headers["Authorization"] = auth
        url = f"{self.prefix}/api/v1/agent/{path}"
        for attempt in range(2):
            if self._aborted:
                raise Unavailable("the client was shut down")
            conn, reused = self._connection(timeout or self.timeout)
            try:
                conn.request("POST", url, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the server had closed the idle connection: once more, fresh
                raise Unavailable(f"connection lost: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise Unavailable(f"server unreachable: {exc}") from None
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return _answer(response.status, response.getheader("Retry-After"), payload)
        raise AssertionError("unreachable")


def _answer(status: int, retry_after: str | None, payload: bytes) -> dict[str, Any]:
    text = payload.decode(errors="replace")
    if status in RETRY_STATUSES:
        raise Unavailable(f"HTTP {status}: {text[:200]}", parse_retry_after(retry_after), status)
    if status >= 400:
        raise ServerError(status, text)
    try:
        answer = json.loads(text or "{}")
    except ValueError:
        raise ServerError(status, f"not JSON: {text[:200]}") from None
    if not isinstance(answer, dict):
        raise ServerError(status, f"not a JSON object: {text[:200]}")
    return answer
