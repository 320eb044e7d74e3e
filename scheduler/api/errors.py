"""One error shape for the API: DRF's field errors as they are, other errors under `detail`.

Every view's SpecError (a bad job, flow or template spec: 400 naming each field) and an agent
endpoint's ProtocolError (its own 4xx, with `Upgrade` for 426 and `WWW-Authenticate` for 401)
are answered here, so views raise them and never catch them."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from berth.web.overload import retry_after_seconds, unavailable_detail
from scheduler.agentapi.common import ProtocolError, protocol_error_headers
from scheduler.intake.specs import SpecError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, SpecError):
        return Response(exc.errors, status=400)
    if isinstance(exc, ProtocolError):
        return Response(exc.errors, status=exc.status, headers=protocol_error_headers(exc))
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    detail = unavailable_detail(exc)
    if detail is not None:
        # No connection free in time, or the database down: come back, not a bug.
        return Response(
            {"detail": detail}, status=503, headers={"Retry-After": str(retry_after_seconds())}
        )
    if isinstance(exc, IntegrityError):
        # A race lost against a constraint (e.g. a duplicate name) is the client's conflict.
        return Response({"detail": f"conflict: {exc}"}, status=409)
    return response
