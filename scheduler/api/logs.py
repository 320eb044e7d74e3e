"""The whole output of one task attempt, streamed as text/plain (`berth logs`, the job page's
download link).

`GET /api/v1/jobs/{job}/tasks/{task}/log/?attempt=N` (default: the task's latest attempt).
The body is read from the database a few chunks at a time (keyset by offset), so a log costs
the server a bounded amount of memory however long it is; it can be no longer than what the
server stored for the attempt (BERTH_LOG_MAX_BYTES and the truncation note). A job that is
not the caller's own answers 404, as if it did not exist (staff see all).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from scheduler.models import Job, Task, TaskLog

CHUNKS_PER_READ = 16  # agents' chunks are at most BERTH_LOG_CHUNK_BYTES (64 KiB) each
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


def read_chunks(task_id: int, attempt: int, after: int) -> list[tuple[int, str]]:
    """The next chunks (offset, text) of an attempt's output, with offsets above `after`."""
    rows = TaskLog.objects.filter(task_id=task_id, attempt=attempt, offset__gt=after)
    return list(rows.order_by("offset").values_list("offset", "data")[:CHUNKS_PER_READ])


class LogStream:
    """An attempt's bytes in offset order; a chunk that overlaps what was sent (an agent
    re-sent output from an earlier offset) contributes only its new tail."""

    def __init__(self, task_id: int, attempt: int) -> None:
        self.task_id, self.attempt = task_id, attempt
        self.after = -1  # offsets read so far
        self.end = 0  # bytes sent so far

    def pieces(self, chunks: list[tuple[int, str]]) -> list[bytes]:
        out = []
        for offset, text in chunks:
            self.after = offset
            data = text.encode()
            stop = offset + len(data)
            if stop > self.end:
                out.append(data[max(0, self.end - offset) :])
                self.end = stop
        return out

    def __iter__(self) -> Iterator[bytes]:
        while chunks := read_chunks(self.task_id, self.attempt, self.after):
            yield from self.pieces(chunks)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = sync_to_async(read_chunks)
        while chunks := await read(self.task_id, self.attempt, self.after):
            for piece in self.pieces(chunks):
                yield piece


def chosen_attempt(request: Request, task: Task) -> int:
    """The `attempt` parameter (default: the task's latest); 400 naming a bad one."""
    unknown = sorted(set(request.query_params) - QUERY_PARAMETERS)
    if unknown:
        raise ValidationError({name: ["unknown parameter; expected attempt"] for name in unknown})
    raw = request.query_params.get("attempt", "")
    attempt = parse_attempt(raw, task) if raw else task.attempt
    if attempt is None:
        raise ValidationError(
            {"attempt": [f"must be a whole number from 0 to {task.attempt} (this task's latest)"]}
        )
    return attempt


def parse_attempt(raw: str, task: Task) -> int | None:
    """`raw` as one of the task's attempts (0 to its latest), or None."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or int(raw) > task.attempt:
        return None
    return int(raw)


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
