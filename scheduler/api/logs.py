"""The whole output of one task attempt, streamed as text/plain (`berth logs`, the job page's
download link).

`GET /api/v1/jobs/{job}/tasks/{task}/log/?attempt=N` (default: the task's latest attempt).
The body is read by scheduler/jobs/logs.py a few chunks at a time (keyset by offset), so a log
costs the server a bounded amount of memory however long it is; it can be no longer than what the
server stored for the attempt (BERTH_LOG_MAX_BYTES and the truncation note). A job that is
not the caller's own answers 404, as if it did not exist (staff see all).
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from scheduler.jobs.logs import LogStream, parse_attempt
from scheduler.models import Job, Task

QUERY_PARAMETERS = {"attempt", "format"}  # format: DRF picks the error renderer


class PlainTextRenderer(BaseRenderer):
    """Lets a client ask for text/plain; the log itself bypasses renderers (it streams)."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Any = None) -> bytes:  # fmt: skip
        if not isinstance(data, dict):
            return f"{data}\n".encode()
        lines = [
            f"{key}: {message}" if key != "detail" else str(message)
            for key, messages in data.items()
            for message in (messages if isinstance(messages, list) else [messages])
        ]
        return "".join(f"{line}\n" for line in lines).encode()


def chosen_attempt(request: Request, task: Task) -> int:
    """The `attempt` parameter (default: the task's latest); 400 naming a bad one."""
    unknown = sorted(set(request.query_params) - QUERY_PARAMETERS)
    if unknown:
        raise ValidationError({name: ["unknown parameter; expected attempt"] for name in unknown})
    raw = request.query_params.get("attempt", "")
    attempt = parse_attempt(raw, task.attempt) if raw else task.attempt
    if attempt is None:
        raise ValidationError(
            {"attempt": [f"must be a whole number from 0 to {task.attempt} (this task's latest)"]}
        )
    return attempt


class TaskAttemptLogView(APIView):
    renderer_classes = [JSONRenderer, PlainTextRenderer]

    @extend_schema(
        parameters=[OpenApiParameter("attempt", int, description="default: the latest")],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the output"),
            400: OpenApiResponse(description="a bad or unknown parameter, named"),
            404: OpenApiResponse(description="no such job or task, or not yours"),
        },
    )
    def get(self, request: Request, job_id: int, task_id: int) -> StreamingHttpResponse:
        """The whole output of one task attempt, streamed as text/plain."""
        job = get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)
        task = get_object_or_404(Task, pk=task_id, job=job)
        attempt = chosen_attempt(request, task)
        stream = LogStream(task.pk, attempt)
        asgi = isinstance(request._request, ASGIRequest)
        response = StreamingHttpResponse(
            stream.__aiter__() if asgi else iter(stream), content_type="text/plain; charset=utf-8"
        )
        name = f"job-{job.pk}-{task.group}-{task.index}-attempt-{attempt}.log"
        response["Content-Disposition"] = f'inline; filename="{name}"'
        response["Cache-Control"] = "no-store"
        return response
