"""The web tier: the ASGI/WSGI server and its workers, request limits and overload answers,
throttles, the /metrics door and the cache backend."""
