"""GET /healthz for load balancers: no login, a few cheap checks, 503 naming what failed.

database: one indexed single-row read (the scheduler heartbeat), which also answers
scheduler: a cycle ran within 5 of the scheduler's intervals; channel_layer: a Redis PING
with a one-second timeout (always ok for the in-memory layer of the embedded mode).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from scheduler.cycle.liveness import scheduler_health

log = logging.getLogger("berth.health")
OK = "ok"
REDIS_TIMEOUT = 1.0
_clients: dict[str, redis.Redis] = {}  # one pooled client per URL, reused across requests


def _redis_urls() -> list[str]:
    config: dict[str, Any] = settings.CHANNEL_LAYERS.get("default", {})
    if "redis" not in str(config.get("BACKEND", "")).lower():
        return []
    urls = []
    hosts: list[Any] = config.get("CONFIG", {}).get("hosts", [])
    for host in hosts:
        if isinstance(host, str):
            urls.append(host)
        elif isinstance(host, dict) and isinstance(host.get("address"), str):
            urls.append(host["address"])
        elif isinstance(host, list | tuple) and len(host) == 2:
            urls.append(f"redis://{host[0]}:{host[1]}")
    return urls


def check_channel_layer() -> str:
    for url in _redis_urls():
        client = _clients.get(url)
        if client is None:
            client = redis.Redis.from_url(
                url, socket_connect_timeout=REDIS_TIMEOUT, socket_timeout=REDIS_TIMEOUT
            )
            _clients[url] = client
        try:
            client.ping()
        except (redis.RedisError, OSError):
            log.warning("healthz: channel layer (Redis) unreachable", exc_info=True)
            return "unreachable"
    return OK


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    body: dict[str, Any] = {"database": OK, "channel_layer": OK, "scheduler": OK,
                            "last_cycle_age_seconds": None}  # fmt: skip
    try:
        health = scheduler_health()
    except Exception:
        log.warning("healthz: database unreachable", exc_info=True)
        body["database"] = "unreachable"
        body["scheduler"] = "unknown (database unreachable)"
    else:
        body["scheduler"] = health.message
        if health.age_seconds is not None:
            body["last_cycle_age_seconds"] = round(health.age_seconds, 3)
    body["channel_layer"] = check_channel_layer()
    healthy = all(body[part] == OK for part in ("database", "channel_layer", "scheduler"))
    return JsonResponse(body, status=200 if healthy else 503)
