"""Django's ASGI handler with the middleware chain and the view in one thread hop, on a
fixed set of threads that take requests first come, first served.

Django's own ASGI handler runs its middleware in async mode. Most of them (sessions, CSRF,
auth, messages, security, common, clickjacking) are sync `MiddlewareMixin` classes, which
in async mode run each of their `process_request`/`process_response` through
`sync_to_async`: about a dozen handoffs between the event loop and the request's thread for
every request, before and after the sync view's own. Measured under `bench/e2e.py`, those
handoffs were a large part of a web worker's CPU per submission (docs/benchmarks.md).

Every view this handler serves is sync (the agents' held leases, the one async view, have
an app of their own: scheduler/agentapi/views.py), so here the whole chain is built in sync mode,
as under WSGI, and runs in one `sync_to_async` call. Request parsing, signals, disconnects
and streaming stay Django's.

Django also starts a new thread for every request (a `ThreadSensitiveContext` per request)
and lets every request in: under load each worker had ~16 requests' threads competing for
one GIL and four pooled connections, so each request took as long as all of them together
(time-sliced), and most of its wall time was spent waiting for a connection or the GIL
(docs/benchmarks.md, "The web tier's tail"). Here a request first takes one of
BERTH_WEB_THREADS single-thread executors, kept for the process's life, and runs all its
thread-sensitive work there (so `request_finished` still closes the connection that thread
used); requests that find none free wait on the event loop in arrival order. The agents'
requests (under /api/v1/agent/, leases apart) take one of BERTH_AGENT_THREADS executors of
their own instead: a burst of either kind never queues the other. One that waits
longer than BERTH_DB_POOL_TIMEOUT is answered 503 with Retry-After, as when the database pool
is exhausted. The body is read before a thread is taken, so a slow upload holds none.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase

from berth.web.limits import _replay
from berth.web.overload import retry_after_seconds

BUSY_DETAIL = "server busy: every request thread taken, retry shortly"
AGENT_PATH = "/api/v1/agent/"  # the agents' requests: a line of their own


class RequestThreads:
    """N single-thread executors handed out strictly first come, first served (an
    `asyncio.Queue` lets a newcomer take a freed item before the waiter it was meant for)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[ThreadPoolExecutor] | None = None
        self._waiters: deque[asyncio.Future[ThreadPoolExecutor | None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for an executor now."""
        return len(self._waiters)

    async def take(self, timeout: float) -> ThreadPoolExecutor | None:
        """A free executor, or None after `timeout` seconds without one; in arrival order."""
        if self._free is None:  # made in the worker, after the fork, at its first request
            self._free = [
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"berth-request-{n}")
                for n in reversed(range(self.size))
            ]
        if self._free and not self.waiting:
            return self._free.pop()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[ThreadPoolExecutor | None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout, _resolve, waiter, None)
        try:
            return await waiter
        except asyncio.CancelledError:
            handed = waiter.result() if waiter.done() and not waiter.cancelled() else None
            if handed is not None:
                self.give_back(handed)  # handed over as the request was cancelled
            raise
        finally:
            timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                _resolve(waiter, executor)
                return
        assert self._free is not None
        self._free.append(executor)


def _resolve(
    waiter: asyncio.Future[ThreadPoolExecutor | None], executor: ThreadPoolExecutor | None
) -> None:
    """Wakes a waiter with an executor, or with None when its time is up (unless already)."""
    if not waiter.done():
        waiter.set_result(executor)


class SharedThreads:
    """ASGI middleware: every request of `app` runs its thread-sensitive work (Django's
    signals, `sync_to_async` calls) on one of `size` single-thread executors kept for the
    process's life, taken in turn, instead of on a new thread per request. For the agents'
    held leases (`LeaseApp`), whose few short database calls do not need a thread of their
    own: starting one per lease blocked the worker's event loop in `Thread.start` until the
    new thread got the GIL, ~12 % of the loop's time under `bench/e2e.py`. A lease holds no
    executor while it waits; its calls queue on the shared thread in order."""

    def __init__(self, app: Any, size: int) -> None:
        self.app = app
        self.size = size
        self._executors: list[ThreadPoolExecutor] = []
        self._next = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._executors:
            self._executors = [
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"berth-shared-{n}")
                for n in range(self.size)
            ]
        executor = self._executors[self._next % self.size]
        self._next += 1
        async with ThreadSensitiveContext(executor=executor):
            await self.app(scope, receive, send)


class OneHopASGIHandler(ASGIHandler):
    def __init__(self, threads: int | None = None) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.threads = RequestThreads(threads or int(settings.BERTH_WEB_THREADS))
        self.agent_threads = RequestThreads(int(settings.BERTH_AGENT_THREADS))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        body = await _read_body(receive, int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
        if body is None:  # the client left before sending it all
            return
        if len(body) > int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE):
            # RequestLimits answers 413 before this for a declared length; this is the rest.
            await _answer(send, 413, "request body too large (BERTH_MAX_BODY_BYTES)")
            return
        # Strictly in arrival order within each line. The agents' reports come in waves (the
        # tasks a cycle placed end together) and wait in a line of their own: in one line
        # with the users' requests a wave held every thread and the submissions queued
        # behind it (docs/benchmarks.md, "Agents in a line of their own").
        # Putting them first (tried) gave submit p99 610-734 ms against 364-404 ms.
        threads = self.agent_threads if _is_agents(scope) else self.threads
        executor = await threads.take(float(settings.DB_POOL_TIMEOUT))
        if executor is None:
            await _answer(send, 503, BUSY_DETAIL, retry_after_seconds())
            return
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, _replay(body, receive), send)
        finally:
            threads.give_back(executor)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def _is_agents(scope: Any) -> bool:
    """Is this request one of the agents' (its path under AGENT_PATH, below any root path
    the server was told to prepend)?"""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return bool(path.startswith(AGENT_PATH))


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The whole body (at most one chunk past `limit`), or None if the client disconnected."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > limit or not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Any, status: int, detail: str, retry_after: int = 0) -> None:
    headers = [(b"content-type", b"application/json")]
    if retry_after:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


def get_asgi_application() -> OneHopASGIHandler:
    """As `django.core.asgi.get_asgi_application`, with the one-hop handler."""
    django.setup(set_prefix=False)
    return OneHopASGIHandler()
