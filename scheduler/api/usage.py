"""GET /api/v1/usage/: what users used, from the accounting records (see docs/usage.md).

A user sees their own usage, staff everyone's. `?format=csv` answers CSV for spreadsheets."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.api.filters import check_query_params
from scheduler.models import UsageRecord
from scheduler.ops.accounting import UsageQueryError, parse_usage_query, usage_rows

METRICS = ("jobs", "tasks", "cpu_seconds", "gpu_seconds", "wall_seconds", "gpu_hours",
           "used_cpu_seconds", "cpu_percent", "memory_percent", "gpu_percent")  # fmt: skip


class UsageCSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:  # fmt: skip
        out = io.StringIO()
        writer = csv.writer(out)
        columns = [*data["group_by"], *METRICS]
        writer.writerow(columns)
        for row in data["results"]:
            writer.writerow([row[c] for c in columns])
        return out.getvalue().encode()


class UsageView(APIView):
    renderer_classes = [JSONRenderer, UsageCSVRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:
            raise ValidationError({"format": ["json or csv"]}) from None

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:  # fmt: skip
        # Only a usage answer is CSV: errors (naming the field) and OPTIONS' description of
        # the endpoint are JSON whatever format was asked for.
        if request.method != "GET" or response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since",
                OpenApiTypes.STR,
                description="date or ISO time; default: 30 days before until",
            ),
            OpenApiParameter("until", OpenApiTypes.STR, description="default: now"),
            OpenApiParameter(
                "group_by",
                OpenApiTypes.STR,
                description="comma-separated: user, queue, day (default user)",
            ),
            OpenApiParameter("user", OpenApiTypes.STR, description="only this user (staff)"),
            OpenApiParameter("queue", OpenApiTypes.STR, description="only this queue"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
        ],  # fmt: skip
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        """Usage of task attempts that ended in [since, until), summed per group."""
        check_query_params(request, {"since", "until", "group_by", "user", "queue"})
        params = {k: request.query_params.get(k, "") for k in
                  ("since", "until", "group_by", "user", "queue")}  # fmt: skip
        try:
            since, until, group_by = parse_usage_query(params, timezone.now())
        except UsageQueryError as exc:
            raise ValidationError(exc.errors) from None
        records = UsageRecord.objects.filter(finished_at__gte=since, finished_at__lt=until)
        user: Any = request.user
        if not user.is_staff:
            records = records.filter(user=user)
        if params["user"]:
            records = records.filter(username=params["user"])
        if params["queue"]:
            records = records.filter(queue=params["queue"])
        return Response(
            {
                "since": since.isoformat(),
                "until": until.isoformat(),
                "group_by": group_by,
                "results": usage_rows(records, group_by),
            }
        )
