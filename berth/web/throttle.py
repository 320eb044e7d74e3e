"""A small limiter for sign-in-like endpoints: password login and agent registration.

Counts failed POSTs per client address and per username in the cache (Redis when REDIS_URL
is set, so every worker process shares the count) for BERTH_LOGIN_WINDOW_SECONDS from the
first one; past BERTH_LOGIN_ATTEMPTS the client gets 429 with Retry-After. An attempt
is counted before the view runs and taken back when it succeeds, so parallel guesses are
counted too while a hundred agents registering from one host never are.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

from berth.web.overload import busy_response

log = logging.getLogger("berth.web.throttle")

# Paths whose POST proves a secret: a password or the cluster's join token.
THROTTLED_PATHS = ("/accounts/login/", "/admin/login/", "/api/v1/agent/register/")


def _attempt_keys(request: HttpRequest) -> list[str]:
    keys = [f"signin:addr:{request.META.get('REMOTE_ADDR', '')}"]
    username = request.POST.get("username", "")
    if username:
        # Hashed: usernames are data, keep arbitrary bytes out of cache keys.
        digest = hashlib.sha256(username.encode("utf-8", "replace")).hexdigest()[:32]
        keys.append(f"signin:user:{digest}")
    return keys


def _count(key: str, window: int) -> int:
    # add() then incr(): atomic in Redis, so concurrent workers never lose a count; the key
    # expires `window` seconds after the first attempt (incr keeps the expiry).
    cache.add(key, 0, timeout=window)
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=window)
        return 1


def _succeeded(request: HttpRequest, response: HttpResponse) -> bool:
    if request.path == "/api/v1/agent/register/":
        return response.status_code < 400
    return response.status_code == 302  # Django's login views redirect on success only


class _Attempt:
    """One POST to a throttled path: counted on creation, refused past the limit."""

    def __init__(self, request: HttpRequest) -> None:
        window = int(settings.BERTH_LOGIN_WINDOW_SECONDS)
        self.keys: list[str] = []
        self.refusal: HttpResponse | None = None
        try:
            self.keys = _attempt_keys(request)
            counts = [_count(key, window) for key in self.keys]
        except Exception:  # the shared cache (Redis) is down: let people sign in, say so
            log.exception("sign-in throttle unavailable; allowing the request")
            self.keys = []
            return
        if max(counts) > settings.BERTH_LOGIN_ATTEMPTS:
            response = busy_response("too many sign-in attempts, retry later", status=429)
            response["Retry-After"] = str(window)  # at most: the count may be older
            self.refusal = response

    def finish(self, request: HttpRequest, response: HttpResponse) -> None:
        if not _succeeded(request, response):
            return
        try:
            for key in self.keys:
                cache.decr(key)
        except Exception:  # expired meanwhile, or the cache is down: nothing to take back
            log.debug("sign-in throttle: count not taken back", exc_info=True)


def _throttled(request: HttpRequest) -> bool:
    return request.method == "POST" and request.path in THROTTLED_PATHS


class SignInThrottleMiddleware:
    """Sync and async capable: other requests pass through without a thread hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        if not _throttled(request):
            return self.get_response(request)
        attempt = _Attempt(request)
        if attempt.refusal is not None:
            return attempt.refusal
        response = self.get_response(request)
        attempt.finish(request, response)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        if not _throttled(request):
            return await self.get_response(request)  # type: ignore[no-any-return]
        attempt = await sync_to_async(_Attempt)(request)
        if attempt.refusal is not None:
            return attempt.refusal
        response: HttpResponse = await self.get_response(request)
        await sync_to_async(attempt.finish)(request, response)
        return response
