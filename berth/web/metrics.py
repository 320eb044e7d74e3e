"""GET /metrics (Prometheus text format) and the HTTP request metrics middleware.

Several web worker processes serve one port in production, so per-process counters would
each tell a different story. When PROMETHEUS_MULTIPROC_DIR is set (the production server sets
it, to a directory it empties at start, before any worker imports this module) the HTTP
metrics are written by prometheus_client's multiprocess mode into files there and every
worker's scrape sums all of them. Without it (embedded: one process) they live in memory.
Cluster and scheduler metrics are read from the database at scrape time (scheduler/ops/metrics.py)
and are the same from any worker.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from scheduler.ops.metrics import ClusterCollector
from scheduler.ops.tokens import KeyRefused, user_for_key

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
_http_registry = CollectorRegistry()
HTTP_REQUESTS = Counter(
    "berth_http_requests", "HTTP requests answered, by method and status.",
    ["method", "status"], registry=_http_registry,
)  # fmt: skip
HTTP_LATENCY = Histogram(
    "berth_http_request_duration_seconds", "Time to answer HTTP requests, by view.", ["view"],
    registry=_http_registry,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)  # fmt: skip
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
_cluster_registry = CollectorRegistry()
_cluster_registry.register(ClusterCollector())


def _observe(request: HttpRequest, response: HttpResponse, seconds: float) -> None:
    method = request.method if request.method in _METHODS else "other"
    match = request.resolver_match
    # Route names, not paths: a bounded set of label values whatever clients ask for.
    view = (match.view_name or match.route or "unnamed") if match else "unmatched"
    HTTP_REQUESTS.labels(method, str(response.status_code)).inc()
    HTTP_LATENCY.labels(view).observe(seconds)


class HttpMetricsMiddleware:
    """Counts every request and times it; works in sync and async handler chains."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        start = time.perf_counter()
        response = self.get_response(request)
        _observe(request, response, time.perf_counter() - start)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        start = time.perf_counter()
        response = await self.get_response(request)
        _observe(request, response, time.perf_counter() - start)
        return response  # type: ignore[no-any-return]


def _refused(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _access(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read metrics: the metrics token, or a staff session or key."""
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    expected = settings.BERTH_METRICS_TOKEN
    if (
        expected
        and scheme.lower() == "bearer"
        and hmac.compare_digest(key.encode(), expected.encode())
    ):
        return None
    user: Any = request.user
    if scheme.lower() in ("token", "bearer") and key:
        try:
            found = user_for_key(key) if len(key) <= 200 else None
        except KeyRefused as exc:
            return _refused(401, str(exc))
        if found is None:
            return _refused(401, "invalid token")
        user = found[0]
    if not user.is_authenticated:
        return _refused(401, "sign in as staff, or send the metrics token")
    if not user.is_staff:
        return _refused(403, "metrics are for staff")
    return None


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _access(request)
    if refused is not None:
        return refused
    body = generate_latest(_cluster_registry) + http_metrics_text()
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def http_metrics_text() -> bytes:
    """The HTTP metrics of this process, or of every worker process in multiprocess mode."""
    if MULTIPROCESS:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(_http_registry)
