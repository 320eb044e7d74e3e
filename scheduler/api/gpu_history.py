"""GET /api/v1/nodes/<name>/gpu-history/ and /api/v1/jobs/<id>/gpu-history/: GPU utilisation
and memory over time, the series the node and job pages chart (docs/metrics.md).

Every signed-in user sees a node's (nodes are visible to all); a job's only its owner and staff
(another user's job is 404, as everywhere). `?after=<until of the last answer>` returns only
newer samples: the pages poll with it every few seconds.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.models import Job, Node
from scheduler.ops import gpu_history

NODE_WINDOW = 3600.0  # seconds a node's chart shows unless asked otherwise
AFTER = OpenApiParameter(
    "after", float, description="Unix seconds: only samples after this (an answer's `until`)"
)


def _number(params: Any, name: str, low: float, high: float) -> float | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails too
        raise ValidationError({name: [f"must be a number from {low:g} to {high:g}"]})
    return value


def _after(request: Request) -> float | None:
    return _number(request.query_params, "after", 0, 2**40)


class NodeGpuHistoryView(APIView):
    @extend_schema(
        parameters=[
            AFTER,
            OpenApiParameter("window", float, description="seconds back from now (default 3600)"),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, name: str) -> Response:
        """Each GPU of the node: utilisation (%) and memory used (bytes) over the window."""
        node = get_object_or_404(Node, name=name)
        window = _number(request.query_params, "window", 1, settings.BERTH_GPU_HISTORY_SECONDS)
        after = _after(request)
        return Response(gpu_history.node_history(node, window or NODE_WINDOW, after))


class JobGpuHistoryView(APIView):
    @extend_schema(parameters=[AFTER], responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, job_id: int) -> Response:
        """The GPUs the job's tasks hold or held, each over the time the task had it."""
        job = get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)
        return Response(gpu_history.job_history(job, _after(request)))
