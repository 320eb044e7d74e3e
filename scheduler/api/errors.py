"""One error shape for the API: DRF's field errors as they are, other errors under `detail`."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from berth.overload import BUSY_DETAIL, is_database_overload, retry_after_seconds


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if is_database_overload(exc):
        # No connection free in time: the client should come back, not report a bug.
        return Response(
            {"detail": BUSY_DETAIL}, status=503, headers={"Retry-After": str(retry_after_seconds())}
        )
    if isinstance(exc, IntegrityError):
        # A race lost against a constraint (e.g. a duplicate name) is the client's conflict.
        return Response({"detail": f"conflict: {exc}"}, status=409)
    return response
