"""HTTP endpoints of the agent protocol (/api/v1/agent/). Agents authenticate with the
cluster join token to register, then with their node token (`Authorization: Node <token>`),
which acts only for its own node."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, status
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.agent import protocol
from scheduler.models import Node


class NodeTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Node"

    def authenticate(self, request: Request) -> tuple[Any, Node] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, token = header.partition(" ")
        if scheme != self.keyword:
            return None
        node = protocol.node_for_token(token.strip())
        if node is None:
            raise exceptions.AuthenticationFailed("unknown node token; register again")
        return (None, node)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class IsNode(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Node)


def _error(exc: protocol.ProtocolError) -> Response:
    return Response(exc.errors, status=exc.status)


class RegisterView(APIView):
    authentication_classes: list[type[authentication.BaseAuthentication]] = []
    permission_classes = [AllowAny]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        """Join the cluster with the join token; returns this node's own token."""
        expected = settings.BERTH_JOIN_TOKEN
        if not expected:
            return Response(
                {"detail": "registration is closed: the server has no BERTH_JOIN_TOKEN"},
                status=status.HTTP_403_FORBIDDEN,
            )
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, given = header.partition(" ")
        # Bytes: compare_digest refuses non-ASCII text, which a header may well hold.
        if scheme != "Bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            return Response({"detail": "wrong or missing join token"}, status=401)
        try:
            return Response(protocol.register(request.data), status=status.HTTP_201_CREATED)
        except protocol.ProtocolError as exc:
            return _error(exc)


class HeartbeatView(APIView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        """Report every task this node runs; receive tasks to start and to kill."""
        assert isinstance(request.auth, Node)
        try:
            return Response(protocol.apply_heartbeat(request.auth, request.data))
        except protocol.ProtocolError as exc:
            return _error(exc)


class TaskLogView(APIView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    # Task output may hold NUL or stray surrogates: append_log stores them as U+FFFD.
    raw_text_fields = ("data",)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, task_id: int) -> Response:
        """Append a chunk of a task's output at a byte offset (re-sent chunks are ignored)."""
        assert isinstance(request.auth, Node)
        try:
            return Response(protocol.append_log(request.auth, task_id, request.data))
        except protocol.ProtocolError as exc:
            return _error(exc)
