"""`GET /api/v1/me/`: who the caller is, so clients (the `berth` CLI) can list "my" jobs with
nothing but a token."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class MeView(APIView):
    @extend_schema(
        responses=inline_serializer(
            "Me", {"username": serializers.CharField(), "is_staff": serializers.BooleanField()}
        )
    )
    def get(self, request: Request) -> Response:
        """The signed-in user: username and whether they are staff."""
        return Response({"username": request.user.get_username(),
                         "is_staff": bool(request.user.is_staff)})  # fmt: skip
