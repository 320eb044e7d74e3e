"""`GET /api/v1/me/`: who the caller is, so clients (the `berth` CLI) can list "my" jobs with
nothing but a token."""

from __future__ import annotations

import secrets
from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.intake.specs import NOTIFY_EVENTS, notify_events, webhook_url_problem
from scheduler.models import NotifyPreference


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


class NotifyPreferenceSerializer(serializers.ModelSerializer[NotifyPreference]):
    """A user's notification defaults (docs/notifications.md)."""

    events = serializers.JSONField(
        required=False,
        help_text="events for jobs whose spec has no `notify`: a list or comma-separated"
        f" string of {', '.join(NOTIFY_EVENTS)}",
    )
    rotate_secret = serializers.BooleanField(
        write_only=True, required=False, help_text="make a new webhook secret"
    )

    class Meta:
        model = NotifyPreference
        fields = ["events", "email", "webhook_url", "webhook_secret", "rotate_secret"]
        read_only_fields = ["webhook_secret"]

    def validate_events(self, value: object) -> str:
        events, problem = notify_events(value)
        if problem:
            raise serializers.ValidationError(problem)
        return ",".join(events)

    def validate_webhook_url(self, value: str) -> str:
        problem = webhook_url_problem(value) if value else None
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def to_representation(self, instance: NotifyPreference) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        data["events"] = notify_events(instance.events)[0]
        return data

    def update(self, instance: NotifyPreference, validated: dict[str, Any]) -> NotifyPreference:
        if validated.pop("rotate_secret", False):
            instance.webhook_secret = secrets.token_hex(32)
        return super().update(instance, validated)


class NotifyPreferenceView(APIView):
    """`/api/v1/me/notifications/`: your notification defaults and webhook secret."""

    @extend_schema(responses=NotifyPreferenceSerializer)
    def get(self, request: Request) -> Response:
        """Your notification defaults; the webhook secret signs your webhooks."""
        pref = NotifyPreference.objects.get_or_create(user=request.user)[0]
        return Response(NotifyPreferenceSerializer(pref).data)

    @extend_schema(request=NotifyPreferenceSerializer, responses=NotifyPreferenceSerializer)
    def patch(self, request: Request) -> Response:
        """Change your defaults: events, email (on/off), webhook_url (a host staff allow),
        rotate_secret."""
        pref = NotifyPreference.objects.get_or_create(user=request.user)[0]
        serializer = NotifyPreferenceSerializer(pref, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        serializer.save()
        return Response(serializer.data)
