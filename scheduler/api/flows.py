"""Run work again over REST: retry a failed flow, resubmit a job or a flow.

`POST /api/v1/flows/{id}/retry/` re-runs a Failed flow's failed and skipped steps (202, the
flow; 409 when it is not Failed). `POST /api/v1/jobs/{id}/resubmit/` and
`/flows/{id}/resubmit/` create a fresh copy (201, the new job or flow), owned by the job's or
flow's owner even when staff ask (docs/security.md). Only the owner and staff reach these;
anyone else gets 404, as for the object itself.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.api.serializers import FlowSerializer, JobSerializer
from scheduler.api.views import FlowViewSet, JobViewSet, answer_submitted, conflict
from scheduler.flows.rerun import resubmit_flow, retry_flow
from scheduler.jobs.operations import OperationError, resubmit_job
from scheduler.models import Flow, Job


def _flow_data(request: Request, flow_id: int) -> dict[str, object]:
    """A flow as GET /flows/{id}/ shows it."""
    view = FlowViewSet(request=request, format_kwarg=None, action="retrieve")
    return dict(FlowSerializer(view.get_queryset().get(pk=flow_id)).data)


class FlowRetryView(APIView):
    @extend_schema(request=None, responses={202: FlowSerializer}, operation_id="flows_retry")
    def post(self, request: Request, flow_id: int) -> Response:
        """Re-run a Failed flow's failed and skipped steps, keeping the succeeded ones and
        their outputs; 409 when the flow is not Failed."""
        flow = get_object_or_404(Flow.objects.visible_to(request.user), pk=flow_id)
        try:
            retry_flow(flow, request.user)
        except OperationError as exc:
            return conflict(exc)
        return Response(_flow_data(request, flow.pk), status=status.HTTP_202_ACCEPTED)


class FlowResubmitView(APIView):
    @extend_schema(request=None, responses={201: FlowSerializer},
                   operation_id="flows_resubmit")  # fmt: skip
    def post(self, request: Request, flow_id: int) -> Response:
        """A fresh copy of the flow from its spec, owned by the flow's owner."""
        flow = get_object_or_404(Flow.objects.visible_to(request.user), pk=flow_id)
        copy = resubmit_flow(flow, request.user)  # a SpecError: 400 (scheduler/api/errors.py)
        return answer_submitted(lambda: _flow_data(request, copy.pk), copy, "flows")


class JobResubmitView(APIView):
    @extend_schema(request=None, responses={201: JobSerializer}, operation_id="jobs_resubmit")
    def post(self, request: Request, job_id: int) -> Response:
        """A fresh copy of the job from its spec, owned by the job's owner."""
        job = get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)
        copy = resubmit_job(job, request.user)  # a SpecError: 400 (scheduler/api/errors.py)
        view = JobViewSet(request=request, format_kwarg=None, action="retrieve")
        return answer_submitted(
            lambda: JobSerializer(view.get_queryset().get(pk=copy.pk)).data, copy, "jobs"
        )
