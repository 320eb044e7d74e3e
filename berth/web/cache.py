"""The Redis cache with one client per process instead of one per request.

Django keeps a cache object per context (`caches` is context-local), and under ASGI every
request runs in a context of its own: with the stock RedisCache each request built a new
client with a new connection pool, so each request that touched the cache (every submission
asks whether a live page is open) opened a new TCP connection to Redis and closed it again.
Here every cache object of a process shares one client, keyed by its servers and options;
redis-py's pool is thread-safe and starts afresh in a forked child.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[str, RedisCacheClient] = {}
_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    """RedisCache whose client (and so its connection pool) is shared per process."""

    @cached_property
    def _cache(self) -> Any:
        mine: Any = self  # RedisCache's attributes are not in django-stubs
        key = repr((mine._servers, sorted(mine._options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = mine._class(mine._servers, **mine._options)
        return client
