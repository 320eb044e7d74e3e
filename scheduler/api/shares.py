"""Fair share over REST (docs/planning.md): `GET /api/v1/usage/shares/` shows each user's
decayed usage, shares and fair-share factor as `sshare` does (a user sees their own line,
staff everyone's); `/api/v1/shares/` sets a user's shares (staff; others read their own)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.api.filters import check_query_params
from scheduler.cycle.fairshare import share_rows, weights
from scheduler.models import UserShare


class StaffWrites(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in permissions.SAFE_METHODS or bool(request.user.is_staff)


class UserShareSerializer(serializers.ModelSerializer[UserShare]):
    user: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all()
    )
    account = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    shares = serializers.FloatField(min_value=0.0, max_value=1e9)

    class Meta:
        model = UserShare
        fields = ["id", "user", "account", "shares"]
        validators: list[Any] = []  # (user, account) unique: checked below, naming the field

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        user = attrs.get("user", getattr(self.instance, "user", None))
        account = attrs.get("account", getattr(self.instance, "account", ""))
        clash = UserShare.objects.filter(user=user, account=account)
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError({"user": ["already has shares in this account"]})
        return attrs


class UserShareViewSet(viewsets.ModelViewSet[UserShare]):
    serializer_class = UserShareSerializer
    permission_classes = [permissions.IsAuthenticated, StaffWrites]

    def get_queryset(self) -> QuerySet[UserShare]:
        rows = UserShare.objects.select_related("user").order_by("account", "user_id")
        return (
            rows if self.request.user.is_staff else rows.filter(user__pk=self.request.user.pk or 0)
        )


class SharesView(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(summary="Each user's decayed usage, shares and fair-share factor (sshare)")
    def get(self, request: Request) -> Response:
        check_query_params(request, set())
        rows = share_rows()
        if not request.user.is_staff:
            rows = [r for r in rows if r.user == request.user.get_username()]
        w = weights()
        return Response({
            "factors_off": w.off,
            "fair_share_weight": w.fair_share,
            "results": [asdict(r) for r in rows],
        })  # fmt: skip
