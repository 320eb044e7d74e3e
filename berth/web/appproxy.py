"""The app proxy: `/apps/<job>/...` to exactly the node address and port of that job's app,
HTTP and websockets, for the job's owner only (docs/interactive.md#web-apps).

An ASGI app routed ahead of Django (berth/asgi.py). Who asks: a browser session (the
session cookie; unsafe methods and websockets only from Berth's own origin) or
`Authorization: Token <key>`. Someone else's job, or one without an app, is 404 whatever
exists. Where it goes: only `scheduler.jobs.webapps.find_app`'s answer, the node's registered
address and the port its agent reported; the request line, Host and every other header are
never used to pick a host. The app sees neither Berth's cookies nor the Authorization header;
it gets Berth's secret for it instead ($BERTH_APP_TOKEN, as `Authorization: token ...` for
jupyter, `X-Berth-App-Token` for http). Bodies stream both ways (httpx), bounded in size and
time; websockets are relayed message by message (`websockets`). What the user does through
it (`note_use`) keeps an interactive GPU job from being ended as idle.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from scheduler.jobs.webapps import AppTarget, app_prefix, app_use_due, find_app, mark_app_used
from scheduler.ops.tokens import KeyRefused, user_for_key

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# The raw request target: /apps/<job> and the rest, as the client sent it (percent-encoded).
ROUTE = re.compile(rb"^/apps/([1-9][0-9]{0,17})(/[^?#]*)?$", re.S)
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
              b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}  # fmt: skip
# Never passed to the app: what it must not see, and what the proxy (or httpx) sets itself.
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"authorization", b"cookie", b"content-length",
                              b"x-csrftoken", b"x-berth-app-token", b"origin",
                              b"forwarded", b"x-forwarded-for", b"x-forwarded-host",
                              b"x-forwarded-proto", b"x-real-ip"}  # fmt: skip
NOT_RETURNED = HOP_BY_HOP | {b"content-length"}
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


def berth_cookies() -> set[str]:
    """The cookies that are Berth's own: never shown to an app, never set by one."""
    return {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


class Refused(Exception):
    """An answer instead of the app's: a status and a line for the person who asked."""

    def __init__(self, status: int, text: str, location: str = "") -> None:
        super().__init__(text)
        self.status, self.text, self.location = status, text, location


def route(scope: Scope) -> tuple[int, bytes]:
    """The job id and the rest of the raw path (from its first '/', or b"")."""
    raw = scope.get("raw_path") or scope["path"].encode()
    match = ROUTE.match(raw.split(b"?", 1)[0])
    if match is None:
        raise Refused(404, "no such app")
    return int(match.group(1)), match.group(2) or b""


def _same_origin(scope: Scope) -> bool:
    """Whether the Origin header, if any, names the host the request was sent to."""
    origin = _header(scope, b"origin")
    if not origin:
        return scope["type"] == "http" and _header(scope, b"sec-fetch-site") != "cross-site"
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == _header(scope, b"host").lower()


def _token_key(scope: Scope) -> str | None:
    """The key of `Authorization: Token <key>` (or Bearer), None without that header."""
    parts = _header(scope, b"authorization").split()
    if not parts or parts[0].lower() not in ("token", "bearer"):
        return None
    if len(parts) != 2 or len(parts[1]) > 200:
        raise Refused(401, "Authorization header: expected 'Token <key>'")
    return parts[1]


def _user_for_token(key: str) -> int | None:
    try:
        found = user_for_key(key)
    except KeyRefused:
        return None
    return found[0].pk if found is not None and found[0].is_active else None


def _session_user(session_key: str) -> int | None:
    """The signed-in user of a session cookie, checked as Django checks it for a view."""
    if not session_key:
        return None
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)
    return int(user.pk) if user.is_authenticated and user.is_active else None


def _find(key: str | None, session_key: str, job_id: int, path: str) -> AppTarget | None:
    """The app for the token's user (`key`), else the session's: one thread hop for both."""
    if key is not None:
        user = _user_for_token(key)
        if user is None:
            raise Refused(401, "invalid token")
    else:
        user = _session_user(session_key)
        if user is None:
            raise Refused(302, "sign in first", f"{settings.LOGIN_URL}?next={quote(path)}")
    return find_app(user, job_id)


def _credentials(scope: Scope) -> tuple[str | None, str]:
    """The API token's key, else the session cookie: websockets and unsafe methods by
    session only from Berth's own origin (another site cannot ride the session cookie)."""
    key = _token_key(scope)
    if key is not None:
        return key, ""
    unsafe = scope["type"] == "websocket" or scope.get("method") in UNSAFE
    if unsafe and not _same_origin(scope):
        raise Refused(403, "cross-origin request refused")
    return None, parse_cookie(_header(scope, b"cookie")).get(settings.SESSION_COOKIE_NAME, "")


async def resolve(scope: Scope) -> tuple[AppTarget, bytes]:
    """The app this request is for and the path it sees, or Refused."""
    host = _header(scope, b"host")
    if not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        raise Refused(400, "invalid Host header")
    job_id, rest = route(scope)
    key, session_key = _credentials(scope)
    target = await database_sync_to_async(_find)(key, session_key, job_id, scope["path"])
    if target is None:
        raise Refused(404, "no such app")
    if not rest:  # /apps/5 -> /apps/5/: relative links in the app's pages then resolve
        raise Refused(301, "moved", app_prefix(job_id))
    if target.port is None or target.host is None:
        raise Refused(502, f"the app of job {job_id} is not running (yet): its job has not "
                           "started, or its agent has not said which port it has")  # fmt: skip
    path = scope.get("raw_path") or scope["path"].encode()
    path = path.split(b"?", 1)[0] if target.kind == "jupyter" else rest.split(b"?", 1)[0]
    query = scope.get("query_string") or b""
    return target, path + (b"?" + query if query else b"")


def _forwarded(scope: Scope, target: AppTarget) -> list[tuple[bytes, bytes]]:
    """The request's headers as the app gets them (Berth's secrets out, the app's in)."""
    named = {v.strip().lower().encode() for v in _header(scope, b"connection").split(",")}
    headers = [(k, v) for k, v in scope.get("headers", []) if k not in NOT_FORWARDED | named]
    cookie = _app_cookies(_header(scope, b"cookie"))
    if cookie:
        headers.append((b"cookie", cookie.encode("latin-1")))
    if target.kind == "jupyter":
        headers.append((b"authorization", f"token {target.token}".encode()))
    else:
        headers.append((b"x-berth-app-token", target.token.encode()))
    return headers


def _app_cookies(header: str) -> str:
    """The Cookie header without Berth's own cookies."""
    ours = berth_cookies()
    kept = []
    for part in header.split(";"):
        name = part.split("=", 1)[0].strip()
        if name and name not in ours:
            kept.append(part.strip())
    return "; ".join(kept)


def _sets_berth_cookie(value: bytes) -> bool:
    try:
        cookie: SimpleCookie = SimpleCookie(value.decode("latin-1"))
    except CookieError:
        return True  # not one we can read: not passed on
    return bool(set(cookie) & berth_cookies())


def returned_headers(
    headers: list[tuple[bytes, bytes]], target: AppTarget
) -> list[tuple[bytes, bytes]]:
    """The app's response headers as the client gets them: hop-by-hop headers out, no cookie
    of Berth's set, and (for an http app, which knows nothing of the prefix) a redirect to
    one of its own paths sent under /apps/<job>/."""
    headers = [(key.lower(), value) for key, value in headers]  # as the app wrote them
    named = {v.strip().lower() for k, v in headers if k == b"connection" for v in v.split(b",")}
    out = []
    for key, value in headers:
        if key in NOT_RETURNED or key in named:
            continue
        if key == b"set-cookie" and _sets_berth_cookie(value):
            continue
        if key == b"location" and target.kind == "http" and value.startswith(b"/"):
            if not value.startswith(b"//"):
                value = app_prefix(target.job_id).encode() + value[1:]
        out.append((key, value))
    return out


async def refuse(send: Send, scope: Scope, refused: Refused) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008 if refused.status < 500 else 1011})
        return
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store")]
    if refused.location:
        headers.append((b"location", refused.location.encode()))
    body = (f"<!doctype html><title>{refused.status}</title>"
            f"<p>{html.escape(refused.text)}</p>\n").encode()  # fmt: skip
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected while its body was being sent on."""


async def request_body(receive: Receive, limit: int) -> AsyncIterator[bytes]:
    """The client's body as it arrives, at most `limit` bytes; a client that sends nothing
    for BERTH_APP_READ_TIMEOUT is let go (a slow client holds no app connection forever)."""
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), settings.BERTH_APP_READ_TIMEOUT)
        except TimeoutError:
            raise ClientGone from None
        if message["type"] == "http.disconnect":
            raise ClientGone  # stops the request to the app
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if chunk:
            yield chunk
        if not message.get("more_body"):
            return


_clients: dict[int, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    """One pooled client per event loop (a process has one; tests may run several)."""
    loop = id(asyncio.get_running_loop())
    if loop not in _clients:
        timeout = httpx.Timeout(
            settings.BERTH_APP_READ_TIMEOUT, connect=settings.BERTH_APP_CONNECT_TIMEOUT
        )
        # trust_env=False: never through a proxy the environment names, only to the node.
        _clients[loop] = httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False,
                                           limits=httpx.Limits(max_connections=200))  # fmt: skip
    return _clients[loop]


def _netloc(target: AppTarget) -> str:
    host = target.host or ""
    return f"[{host}]:{target.port}" if ":" in host else f"{host}:{target.port}"


async def note_use(job_id: int) -> None:
    """The user acted on the app: a message on one of its websockets (a notebook's cell run,
    its terminal's keys) or a request that changes something (a notebook saved). Reads
    (GET, HEAD) are not use: an open notebook tab polls by itself for as long as it stays
    open, so they would keep an idle GPU session alive forever. A database that cannot take
    the write (an outage) fails nothing: the request is proxied all the same."""
    if app_use_due(job_id):
        try:
            await database_sync_to_async(mark_app_used)(job_id)
        except Exception:  # noqa: BLE001 - the request goes on; its use is written next time
            log.warning("could not write the use of job %s's app", job_id, exc_info=True)


async def proxy_http(scope: Scope, receive: Receive, send: Send, target: AppTarget,
                     path: bytes) -> None:  # fmt: skip
    """Send the request to the app and stream its answer back; 502 naming the job when the
    app does not answer."""
    length = _header(scope, b"content-length")
    limit = settings.BERTH_APP_MAX_BODY_BYTES
    if length.isdigit() and int(length) > limit:
        raise Refused(413, f"request body larger than {limit} bytes (BERTH_APP_MAX_BODY_BYTES)")
    if scope["method"] in UNSAFE:
        await note_use(target.job_id)
    headers = _forwarded(scope, target)
    if length.isdigit():
        headers.append((b"content-length", length.encode()))
    has_body = length.isdigit() or _header(scope, b"transfer-encoding")
    url = httpx.URL(f"http://{_netloc(target)}").copy_with(raw_path=path)
    request = client().build_request(
        scope["method"], url, headers=headers,
        content=request_body(receive, limit) if has_body else None,
    )  # fmt: skip
    try:
        response = await client().send(request, stream=True)
    except BodyTooLarge:
        raise Refused(413, f"request body larger than {limit} bytes") from None
    except ClientGone:
        return
    except httpx.HTTPError as exc:
        why = type(exc).__name__
        raise Refused(502, f"the app of job {target.job_id} does not answer ({why});"
                           " it may still be starting") from None  # fmt: skip
    try:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": returned_headers(response.headers.raw, target)})  # fmt: skip
        # A client that takes no chunk for BERTH_APP_READ_TIMEOUT is cut off, as an app
        # that sends none is.
        wait = settings.BERTH_APP_READ_TIMEOUT
        async for chunk in response.aiter_raw():
            message = {"type": "http.response.body", "body": chunk, "more_body": True}
            await asyncio.wait_for(send(message), wait)
        await send({"type": "http.response.body", "body": b""})
    except (httpx.HTTPError, TimeoutError) as exc:  # cut off mid-answer: so is the client
        log.warning("app of job %s: answer cut off: %s", target.job_id, exc or "client stalled")
    finally:
        await response.aclose()


async def proxy_websocket(scope: Scope, receive: Receive, send: Send, target: AppTarget,
                          path: bytes) -> None:  # fmt: skip
    """Connect to the app's websocket, then accept the client's and relay both ways."""
    if (await receive())["type"] != "websocket.connect":
        return
    named = {b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
             b"sec-websocket-protocol"}  # fmt: skip
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in _forwarded(scope, target)
               if k not in named]  # fmt: skip
    uri = f"ws://{_netloc(target)}{path.decode('latin-1')}"
    try:
        upstream = await connect(
            uri, additional_headers=headers, subprotocols=scope.get("subprotocols") or None,
            open_timeout=settings.BERTH_APP_CONNECT_TIMEOUT, proxy=None, compression=None,
            max_size=settings.BERTH_APP_MAX_MESSAGE_BYTES, user_agent_header=None,
        )  # fmt: skip
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        log.info("app of job %s: websocket refused: %s", target.job_id, exc)
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    async with upstream:
        await relay(receive, send, upstream, target.job_id)


async def relay(receive: Receive, send: Send, upstream: ClientConnection, job_id: int) -> None:
    """Messages both ways until either side closes; then the other is closed too. What the
    user sends is the app's use (a notebook's kernel socket stays open for hours)."""

    async def to_app() -> None:
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            await note_use(job_id)
            data = message.get("bytes")
            await upstream.send(data if data is not None else message.get("text") or "")

    async def to_client() -> None:
        try:
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        except ConnectionClosed:
            pass
        await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    tasks = [asyncio.ensure_future(to_app()), asyncio.ensure_future(to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class AppProxy:
    """The ASGI app for /apps/ (HTTP and websockets). It reads the session cookie itself,
    in the same thread hop as the job's lookup, and only when no token is given."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            target, path = await resolve(scope)
            if scope["type"] == "websocket":
                await proxy_websocket(scope, receive, send, target, path)
            else:
                await proxy_http(scope, receive, send, target, path)
        except Refused as refused:
            await refuse(send, scope, refused)


class AppRoutes:
    """`/apps/...` to the app proxy, everything else to `rest` (decided on the decoded
    path, as the routers after it do; the proxy then reads the raw one)."""

    def __init__(self, apps: Any, rest: Any) -> None:
        self.apps, self.rest = apps, rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith("/apps/"):
            await self.apps(scope, receive, send)
        else:
            await self.rest(scope, receive, send)
