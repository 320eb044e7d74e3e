"""A small limiter for sign-in-like endpoints: password login and agent registration.

Counts POSTs per client address and per username in the cache (Redis when REDIS_URL is set,
so every worker process shares the count) over a fixed window; past BERTH_LOGIN_ATTEMPTS the
client gets 429 with Retry-After until the window ends. Every POST counts, successful or not:
a person signs in a few times a minute at most, a password guesser thousands of times.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

from berth.overload import busy_response

# Paths whose POST proves a secret: a password or the cluster's join token.
THROTTLED_PATHS = ("/accounts/login/", "/admin/login/", "/api/v1/agent/register/")


def _attempt_keys(request: HttpRequest, window_start: int) -> list[str]:
    keys = [f"signin:{window_start}:addr:{request.META.get('REMOTE_ADDR', '')}"]
    username = request.POST.get("username", "")
    if username:
        # Hashed: usernames are data, keep arbitrary bytes out of cache keys.
        digest = hashlib.sha256(username.encode("utf-8", "replace")).hexdigest()[:32]
        keys.append(f"signin:{window_start}:user:{digest}")
    return keys


def _count(key: str, window: int) -> int:
    # add() then incr(): atomic in Redis, so concurrent workers never lose a count.
    cache.add(key, 0, timeout=window + 1)
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=window + 1)
        return 1


class SignInThrottleMiddleware:
    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path in THROTTLED_PATHS:
            window = int(settings.BERTH_LOGIN_WINDOW_SECONDS)
            now = int(time.time())
            window_start = now - now % window
            counts = [_count(key, window) for key in _attempt_keys(request, window_start)]
            if max(counts) > settings.BERTH_LOGIN_ATTEMPTS:
                response = busy_response("too many sign-in attempts, retry later", status=429)
                response["Retry-After"] = str(window_start + window - now)
                return response
        return self.get_response(request)
