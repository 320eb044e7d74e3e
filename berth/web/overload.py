"""Out of database connections, or a database that is down, is not a bug: answer 503 with
Retry-After.

A request that waited BERTH_DB_POOL_TIMEOUT seconds for a pooled connection (psycopg_pool's
PoolTimeout), that PostgreSQL refused ("too many clients", SQLSTATE 53300), or that met a
database restarting, unreachable or out of disk (scheduler/ops/faults.py) is told to come back
shortly, with a detail that says which. Its transaction was rolled back, so nothing of it was
written. Everything else keeps Django's normal 500 path, so real bugs stay visible.
Three entry points share one test: DRF's exception handler (scheduler/api/errors.py), this
middleware for plain Django views, and handler500 for errors raised in middleware.
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views import defaults
from psycopg_pool import PoolTimeout

from scheduler.ops import faults

# PostgreSQL's too_many_connections: max_connections, a role's or a database's limit.
TOO_MANY_CONNECTIONS = "53300"
REFUSED_MESSAGES = (
    "too many clients",  # max_connections
    "too many connections for",  # a role's or a database's CONNECTION LIMIT
    "remaining connection slots are reserved",
)
BUSY_DETAIL = "server busy: no database connection free, retry shortly"
DOWN_DETAIL = "database unavailable, retry shortly"
FULL_DETAIL = "database cannot write (disk full or read-only): no new work accepted, retry later"
CONFLICT_DETAIL = "a concurrent change to the same rows won: nothing was written, retry shortly"


def is_database_overload(exc: BaseException | None) -> bool:
    """True when `exc` (or what it wraps: Django re-raises driver errors as its own) means
    no database connection could be had."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, PoolTimeout):
            return True
        if isinstance(exc, psycopg.OperationalError) and (
            exc.sqlstate == TOO_MANY_CONNECTIONS
            # A refused connection carries no SQLSTATE in psycopg, only the server's message.
            or any(words in str(exc) for words in REFUSED_MESSAGES)
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def unavailable_detail(exc: BaseException | None) -> str | None:
    """The 503's detail when `exc` means the database is overloaded, down or full, or the
    request's transaction lost a deadlock PostgreSQL broke (rolled back whole: retrying is
    safe); None for anything else (a bug: the normal 500)."""
    if is_database_overload(exc):
        return BUSY_DETAIL
    if faults.database_cannot_write(exc):
        return FULL_DETAIL
    if faults.database_down(exc):
        return DOWN_DETAIL
    if faults.database_conflict(exc):
        return CONFLICT_DETAIL
    return None


def retry_after_seconds() -> int:
    return int(settings.BERTH_RETRY_AFTER_SECONDS)


def busy_response(detail: str = BUSY_DETAIL, status: int = 503) -> HttpResponse:
    response = JsonResponse({"detail": detail}, status=status)
    response["Retry-After"] = str(retry_after_seconds())
    return response


class DatabaseOverloadMiddleware(MiddlewareMixin):
    """Turns a view's connection-starved exception into 503 + Retry-After. Sync and async
    capable, so async views (the agents' held leases) are not pushed onto a thread."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        detail = unavailable_detail(exception)
        return None if detail is None else busy_response(detail)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it inside its `except`, so the exception is at hand."""
    detail = unavailable_detail(sys.exc_info()[1])
    if detail is not None:
        return busy_response(detail)
    return defaults.server_error(request)
