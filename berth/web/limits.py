"""ASGI guards in front of Django: request body size and in-flight requests per process.

Both answer before Django reads a byte of the body. Django's ASGI handler spools a whole
body to memory/disk before any view runs, and DRF's parsers read the stream directly, so
DATA_UPLOAD_MAX_MEMORY_SIZE alone would not bound what a client can make the server take in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

# Plain callables: asgiref's TypedDict events are more ceremony than this file needs.
Scope = dict[str, Any]
App = Any
ASGIReceiveCallable = Callable[[], Awaitable[Any]]
ASGISendCallable = Callable[[dict[str, Any]], Awaitable[None]]


async def _answer(send: ASGISendCallable, status: int, detail: str, retry_after: int = 0) -> None:
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    if retry_after:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestLimits:
    """Wraps the HTTP app: 413 for a body over BERTH_MAX_BODY_BYTES, 503 + Retry-After when
    BERTH_MAX_INFLIGHT requests are already in progress in this process (0: no limit)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.inflight = 0

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        too_big = f"request body larger than {limit} bytes (BERTH_MAX_BODY_BYTES)"
        length = _content_length(scope)
        if length is not None and length > limit:
            await _answer(send, 413, too_big)
            return
        max_inflight = int(settings.BERTH_MAX_INFLIGHT)
        if max_inflight and self.inflight >= max_inflight:
            retry = int(settings.BERTH_RETRY_AFTER_SECONDS)
            await _answer(send, 503, "server busy, retry shortly", retry_after=retry)
            return
        self.inflight += 1
        try:
            if length is None:
                # Chunked upload: read it here, within the limit, and replay it to Django.
                body = await _read_bounded(receive, limit)
                if body is None:
                    await _answer(send, 413, too_big)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1


async def _read_bounded(receive: ASGIReceiveCallable, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Any = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # disconnected: Django sees an empty/short body and ends
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: ASGIReceiveCallable) -> ASGIReceiveCallable:
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then wait for the disconnect, as Django expects

    return replay
