"""/api/v1/tokens/: users make, list and revoke their own API tokens; `berth login` trades a
username and password for one (see scheduler/api/authentication.py for how keys sign in)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated, ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, ScopedRateThrottle

from scheduler.api import schema  # noqa: F401 - registers the token auth scheme
from scheduler.models import ApiToken
from scheduler.ops.tokens import TokenError, create_token, revoke_token

log = logging.getLogger("berth.api")


class TokenCreateThrottle(ScopedRateThrottle):
    """Limits token creation (password guessing through `berth login`): per client address
    when anonymous, per user when signed in. The rate is BERTH_TOKEN_CREATE_RATE."""

    def get_rate(self) -> str:
        return str(settings.BERTH_TOKEN_CREATE_RATE)

    def get_ident(self, request: Request) -> str:
        # DRF trusts X-Forwarded-For unless NUM_PROXIES is set, which would let a client
        # pick a fresh address per guess; use the socket's address unless proxies are set.
        if api_settings.NUM_PROXIES is None:
            return str(request.META.get("REMOTE_ADDR", ""))
        return super().get_ident(request)

    def allow_request(self, request: Request, view: Any) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception:  # the shared cache (Redis) is down: fail open, say so
            log.exception("token throttle unavailable; allowing the request")
            return True


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "expires_at"]
        read_only_fields = fields


class TokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, allow_blank=False)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    username = serializers.CharField(max_length=150, required=False)
    password = serializers.CharField(max_length=4096, required=False, trim_whitespace=False)


class CreateOpenToAll(permissions.BasePermission):
    """POST may come without auth (username and password in the body); the rest need auth."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if getattr(view, "action", None) == "create":
            return True
        return bool(request.user and request.user.is_authenticated)


class TokenViewSet(
    mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet[ApiToken]
):
    serializer_class = TokenSerializer
    permission_classes = [CreateOpenToAll]
    throttle_scope = "token-create"
    lookup_value_regex = r"[0-9]+"

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no user
            return ApiToken.objects.none()
        user: Any = self.request.user  # authenticated (CreateOpenToAll)
        return ApiToken.objects.filter(user=user).order_by("-id")

    def get_throttles(self) -> list[BaseThrottle]:
        return [TokenCreateThrottle()] if self.action == "create" else []

    @extend_schema(request=TokenCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Make a token. Signed in (session or token): `{"name"}`. Not signed in:
        `{"username", "password", "name"}`. The key is in `token`, shown this once."""
        body = TokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "username" in data or "password" in data:
            missing = [f for f in ("username", "password") if f not in data]
            if missing:
                raise ValidationError({f: ["required with username/password sign-in"]
                                       for f in missing})  # fmt: skip
            user = authenticate(request._request, username=data["username"],
                                password=data["password"])  # fmt: skip
            if user is None:  # never say whether the user or the password was wrong
                raise AuthenticationFailed("invalid username or password")
        elif request.user and request.user.is_authenticated:
            user = request.user
        else:
            raise NotAuthenticated("sign in, or send username and password")
        try:
            token, key = create_token(user, data["name"], data.get("expires_at"))
        except TokenError as exc:
            raise ValidationError(exc.errors) from None
        out = dict(TokenSerializer(token).data)
        out["token"] = key
        return Response(out, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Revoke one of your tokens; another user's token is a 404."""
        token = get_object_or_404(self.get_queryset(), pk=kwargs["pk"])
        revoke_token(request.user, token.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)
