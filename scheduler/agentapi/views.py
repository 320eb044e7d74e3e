"""HTTP endpoints of the agent protocol (/api/v1/agent/, described in docs/agents.md).

Agents authenticate with the cluster join token to register a new name, then with their node
token (`Authorization: Node <token>`), which acts only for its own node, re-registration
included. Every request carries the
protocol version in the `Berth-Agent-Protocol` header; an agent speaking another version is
refused with 426 before anything else.

`lease/` is an async view: it is held open while the node has no orders, without a thread or
a database connection, and woken through the channel layer when the scheduler commits orders
for the node (scheduler.notify). Under ASGI it is served by `LeaseApp`, routed ahead of the
middleware stack (berth/asgi.py): a sync-only middleware there (WhiteNoise) would run each
request in a thread of its own, blocked for as long as the lease is held. The other
endpoints are short and synchronous.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, status
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler import notify
from scheduler.agent.wire import PROTOCOL, PROTOCOL_HEADER
from scheduler.agentapi import lease
from scheduler.agentapi.common import (
    ProtocolError,
    check_protocol,
    node_for_token,
    protocol_error_headers,
)
from scheduler.agentapi.logs import append_log
from scheduler.agentapi.register import register
from scheduler.agentapi.report import apply_report
from scheduler.models import Node
from scheduler.ops.faults import Outage

T = TypeVar("T")
log = logging.getLogger("berth.agent")
LEASE_RETRY_AFTER = 1  # seconds an agent waits when its lease cannot reach the database
_lease_outage = Outage("database (agents' leases)", log)  # only its logging is used here


class NodeTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Node"

    def authenticate(self, request: Request) -> tuple[Any, Node] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, token = header.partition(" ")
        if scheme != self.keyword:
            return None
        node = node_for_token(token.strip())
        if node is None:
            raise exceptions.AuthenticationFailed("unknown node token; register again")
        return (None, node)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class IsNode(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Node)


class AgentView(APIView):
    """Refuses other protocol versions first. A ProtocolError becomes its 4xx answer in the
    API's exception handler (scheduler/api/errors.py)."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        header = request.headers.get(PROTOCOL_HEADER)
        if header is None or header.strip() != str(PROTOCOL):
            data = request.data if isinstance(self, RegisterView) else None
            check_protocol(header, data.get("version") if isinstance(data, dict) else None)
        super().initial(request, *args, **kwargs)


class RegisterView(AgentView):
    authentication_classes: list[type[authentication.BaseAuthentication]] = []
    permission_classes = [AllowAny]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        """Join the cluster with the join token (new names only; returns the node's own token),
        or register again with the node's own token (`Authorization: Node <token>`)."""
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, given = header.partition(" ")
        if scheme == NodeTokenAuthentication.keyword:
            answer = register(request.data, given.strip(), _address(request))
            return Response(answer, status=status.HTTP_200_OK)
        expected = settings.BERTH_JOIN_TOKEN
        if not expected:
            return Response(
                {"detail": "registration is closed: the server has no BERTH_JOIN_TOKEN"},
                status=status.HTTP_403_FORBIDDEN,
            )
        # Bytes: compare_digest refuses non-ASCII text, which a header may well hold.
        if scheme != "Bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            return Response({"detail": "wrong or missing join token"}, status=401)
        answer = register(request.data, address=_address(request))
        return Response(answer, status=status.HTTP_201_CREATED)


def _address(request: Request) -> str:
    """Where the agent registered from: the peer's address (behind a proxy the server
    trusts, BERTH_FORWARDED_ALLOW_IPS, the client's, as uvicorn sets it)."""
    return str(request.META.get("REMOTE_ADDR") or "")[:64]


class ReportView(AgentView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        """Report every task this node runs (sent when one starts or ends); receive orders."""
        assert isinstance(request.auth, Node)
        return Response(apply_report(request.auth, request.data))


class HeartbeatView(AgentView):
    """Protocol 1's endpoint, kept so that an old agent is told to upgrade."""

    authentication_classes: list[type[authentication.BaseAuthentication]] = []
    permission_classes = [AllowAny]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        """Gone with protocol 1: agents now use `report/` and `lease/`."""
        return Response({"detail": f"protocol {PROTOCOL} uses report/ and lease/"}, status=410)


class AgentTaskLogView(AgentView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    # Task output may hold NUL or stray surrogates: append_log stores them as U+FFFD.
    raw_text_fields = ("data",)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, task_id: int) -> Response:
        """Append a chunk of a task's output at a byte offset (re-sent chunks are ignored)."""
        assert isinstance(request.auth, Node)
        return Response(append_log(request.auth, task_id, request.data))


# --- lease (async) -----------------------------------------------------------------------


def _json_error(exc: ProtocolError) -> JsonResponse:
    """The lease view is plain Django (no DRF): the same answer as the API's handler gives."""
    return JsonResponse(exc.errors, status=exc.status, headers=protocol_error_headers(exc))


def _release_connections() -> None:
    """Give the database connections of this thread back (to the pool, or closed) so that a
    held lease owns none; a test's enclosing transaction is left alone."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


async def _db(fn: Callable[..., T], *args: Any) -> T:
    def run() -> T:
        try:
            return fn(*args)
        finally:
            _release_connections()

    return await sync_to_async(run)()


def _lease_request(request: HttpRequest) -> tuple[str, dict[str, Any], float]:
    """The node token, the body and how long the agent is willing to wait."""
    check_protocol(request.headers.get(PROTOCOL_HEADER))
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Node" or not token.strip():
        raise ProtocolError({"detail": ["a node token is required"]}, status=401)
    try:
        data = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError({"body": ["must be JSON"]}) from None
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    hold = lease.lease_seconds()
    wait = data.get("wait", hold)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e9:
        raise ProtocolError({"wait": ["must be a number of seconds, 0 or more"]})
    return token.strip(), data, min(float(wait), hold)


@csrf_exempt
async def lease_view(request: HttpRequest) -> JsonResponse:
    """Renew this node's lease and wait (up to the lease) for orders: tasks to start or kill."""
    if request.method != "POST":
        return JsonResponse({"detail": "use POST"}, status=405)
    try:
        token, data, hold = _lease_request(request)
    except ProtocolError as exc:
        return _json_error(exc)
    if isinstance(request, ASGIRequest):
        notify.remember_server_loop()  # this view runs on the ASGI server's own loop
    waiter = notify.OrdersWaiter()
    await waiter.open()  # before reading the orders, so a commit in between still wakes us
    try:
        try:
            node, reports, answer = await _db(lease.renew_lease, token, data)
            deadline = time.monotonic() + hold
            while not (answer["start"] or answer["kill"]):
                if not await waiter.wait(node.pk, deadline - time.monotonic()):
                    break
                answer = await _db(lease.lease_orders, node, reports)
        except ProtocolError as exc:
            return _json_error(exc)
        except DatabaseError as exc:
            # No connection to be had (pool exhausted, database restarting): come back soon.
            _lease_outage.failed(exc)  # logged once per outage, not once per agent
            busy = JsonResponse({"detail": "database busy; retry"}, status=503)
            busy["Retry-After"] = str(LEASE_RETRY_AFTER)
            return busy
    finally:
        await waiter.close()
    _lease_outage.recovered()
    return JsonResponse(answer)


class LeaseApp(ASGIHandler):
    """`lease/` as an ASGI app of its own: Django's request handling (body, signals, the
    view cancelled when the agent goes away), without the middleware stack."""

    def __init__(self) -> None:
        BaseHandler.__init__(self)  # no middleware: none of it concerns an agent's lease
        self._view: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = (
            convert_exception_to_response(lease_view)  # type: ignore[assignment]
        )

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await self._view(request)
