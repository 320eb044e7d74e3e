"""The REST API (/api/v1/). Ownership: users see and act on their own jobs and flows (others
get 404, not 403, so nothing leaks); staff on all. Queues, nodes and templates are readable by
every signed-in user and writable by staff."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.db import DatabaseError
from django.db.models import Prefetch, ProtectedError, QuerySet
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from scheduler.api.filters import choice_filter, query_flag
from scheduler.api.schema import (
    FLOW_EXAMPLES,
    JOB_EXAMPLES,
    TEMPLATE_EXAMPLES,
    ExtendRequest,
    FlowSpec,
    JobSpec,
    TemplateSpec,
)
from scheduler.api.serializers import (
    EventSerializer,
    FlowSerializer,
    JobListSerializer,
    JobSerializer,
    NodeSerializer,
    QueueSerializer,
    TemplateSerializer,
)
from scheduler.intake.specs import extend_seconds
from scheduler.jobs import logs, operations
from scheduler.jobs.extend import ExtendRefused, extend_walltime
from scheduler.jobs.submit import create_flow, create_template, submit_job, update_template
from scheduler.models import (
    Allocation,
    Device,
    Event,
    Flow,
    Job,
    JobTemplate,
    Node,
    Queue,
    Task,
)
from scheduler.ops.faults import database_down
from scheduler.states.names import FLOW_FINAL, FlowState, JobState, NodeState

# Names never hold NUL (PostgreSQL cannot even compare one): such a path is a 404.
NAME_LOOKUP = r"[^/\x00]+"
DEFAULT_QUEUE = "default"
MAX_QUERY_INT = 2**63 - 1  # the largest id a database key holds; a larger one names nothing


class StaffWritesOnly(permissions.BasePermission):
    """Reads for every signed-in user, writes for staff."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or bool(request.user.is_staff)


def paginated_events(view: viewsets.GenericViewSet[Any], events: QuerySet[Event]) -> Response:
    paginator = view.paginator
    assert paginator is not None
    page = paginator.paginate_queryset(events.select_related("node"), view.request, view=view)
    return paginator.get_paginated_response(EventSerializer(page, many=True).data)


def conflict(exc: Exception) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


class QueueViewSet(viewsets.ModelViewSet[Queue]):
    queryset = Queue.objects.all()
    serializer_class = QueueSerializer
    permission_classes = [StaffWritesOnly]
    lookup_field = "name"
    lookup_value_regex = NAME_LOOKUP

    def perform_destroy(self, instance: Queue) -> None:
        if instance.name == DEFAULT_QUEUE:
            raise ValidationError({"name": ["the default queue is where jobs go by default"]})
        try:
            instance.delete()
        except ProtectedError:
            raise ValidationError({"name": ["the queue still has jobs"]}) from None


class NodeFilter(filters.FilterSet):
    state = choice_filter(NodeState.choices, "node state")

    class Meta:
        model = Node
        fields = ["state"]


class NodeViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Node],
):
    serializer_class = NodeSerializer
    permission_classes = [StaffWritesOnly]
    lookup_field = "name"
    lookup_value_regex = NAME_LOOKUP
    filterset_class = NodeFilter
    http_method_names = ["get", "patch", "post", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.prefetch_related(
            Prefetch(
                "devices",
                queryset=Device.objects.prefetch_related(
                    "allocations__task", "mig_instances"
                ).order_by("index"),
            ),
            Prefetch("tasks", queryset=Task.objects.filter(state__in=("Assigned", "Running"))),
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Forget a node (staff). Its tasks end Lost and their devices are freed at once; each
        of their jobs then follows its retry policy (runs again elsewhere, or Failed)."""
        operations.delete_node(self.get_object(), request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _operate(self, fn: Any) -> Response:
        node = fn(self.get_object(), self.request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, name: str) -> Response:
        """Stop placing new tasks on the node; running ones go on."""
        return self._operate(operations.cordon_node)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, name: str) -> Response:
        return self._operate(operations.uncordon_node)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name: str) -> Response:
        """Stop placing new tasks; once the running jobs finish the node is Drained."""
        return self._operate(operations.drain_node)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], url_path="reset-token")
    def reset_token(self, request: Request, name: str) -> Response:
        """Staff: forget the node's token, so that the next agent registering this name with
        the join token takes it (a reinstalled machine, or a leaked node token)."""
        return self._operate(operations.reset_node_token)


class TemplateViewSet(viewsets.ModelViewSet[JobTemplate]):
    queryset = JobTemplate.objects.select_related("owner")
    serializer_class = TemplateSerializer
    permission_classes = [StaffWritesOnly]
    lookup_field = "name"
    lookup_value_regex = NAME_LOOKUP
    http_method_names = ["get", "post", "put", "delete", "head", "options"]

    @extend_schema(request=TemplateSpec, responses={201: TemplateSerializer},
                   examples=TEMPLATE_EXAMPLES)  # fmt: skip
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        template = create_template(request.user, request.data)
        return Response(self.get_serializer(template).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TemplateSpec, responses=TemplateSerializer,
                   examples=TEMPLATE_EXAMPLES)  # fmt: skip
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        template = update_template(self.get_object(), request.data)
        return Response(self.get_serializer(template).data)

    def perform_destroy(self, instance: JobTemplate) -> None:
        try:
            instance.delete()
        except ProtectedError:
            raise ValidationError({"name": ["flows still use this template"]}) from None


class IdFilter(filters.NumberFilter):
    """An id: a whole number the database can hold (a bigger one is a 400, not a 500)."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, min_value=0, max_value=MAX_QUERY_INT, **kwargs)


class JobFilter(filters.FilterSet):
    state = choice_filter(JobState.choices, "job state")
    queue = filters.CharFilter(field_name="queue__name")
    owner = filters.CharFilter(field_name="owner__username")
    flow = IdFilter(field_name="flow_id")
    array = IdFilter(field_name="array_parent_id", label="the elements of this array")
    # `berth show 4_0`: with `array`, the one element of that index (an indexed lookup).
    index = IdFilter(field_name="array_index", label="the array element of this index")

    class Meta:
        model = Job
        fields = ["state", "queue", "owner", "flow", "array", "index"]


_NEW_JOB = JobSerializer()  # its fields, built once: DRF builds them again for each instance


def show_new_job(job: Job) -> dict[str, Any]:
    """A job just submitted, as JobSerializer shows it, from the objects just written (its
    tasks included) instead of reading it back: the submit path is the API's busiest. An
    array's parent is read back (its element counts come from the database)."""
    if "tasks" not in getattr(job, "_prefetched_objects_cache", {}):
        job = Job.objects.select_related("owner", "queue", "template", "step").get(pk=job.pk)
        return dict(JobSerializer(job).data)
    return dict(_NEW_JOB.to_representation(job))


def answer_submitted(read: Callable[[], Any], written: Job | Flow, path: str) -> Response:
    """201 with `read()` as the body; but once a submission has committed, a database that
    goes away before its answer is read back must not turn it into a 503 (a 503 says
    nothing was written, and the client would submit it again): the answer is then its id
    and where to read it."""
    try:
        data = read()
    except DatabaseError as exc:
        if not database_down(exc):
            raise
        location = f"/api/v1/{path}/{written.pk}/"
        data = {"id": written.pk, "name": written.name, "url": location,
                "detail": "submitted; the database went away before the answer could be read:"
                          f" GET {location}"}  # fmt: skip
    return Response(data, status=status.HTTP_201_CREATED)


def _flat(request: Request) -> bool:
    """Does a job list ask for array elements beside the other jobs?"""
    return "array" in request.query_params or query_flag(request, "flat")


class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet[Job],
):
    filterset_class = JobFilter
    ordering_fields = ["id", "priority", "created_at"]
    extra_query_params = ("flat",)
    list_actions = ("events",)

    def get_queryset(self) -> QuerySet[Job]:
        jobs = Job.objects.visible_to(self.request.user).select_related(
            "owner", "queue", "template", "step"
        )
        if self.action == "list" and not _flat(self.request):
            jobs = jobs.filter(array_parent__isnull=True)  # an array is one row: its parent
        if self.action != "list":
            jobs = jobs.prefetch_related(
                Prefetch(
                    "tasks",
                    queryset=Task.objects.select_related("node").prefetch_related(
                        Prefetch(
                            "allocations", queryset=Allocation.objects.select_related("device")
                        )
                    ),
                )
            )
        return jobs

    def get_serializer_class(self) -> type[BaseSerializer[Job]]:
        return JobListSerializer if self.action == "list" else JobSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        # Only one job's page spells out its array's indices per state (it reads every row).
        return {**super().get_serializer_context(), "array_indices": self.action == "retrieve"}

    @extend_schema(
        parameters=[
            OpenApiParameter("array", int, description="only the elements of this array"),
            OpenApiParameter(
                "flat",
                bool,
                description="array elements beside the other jobs (default: an"
                " array is one row, its parent)",
            ),  # fmt: skip
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Jobs, newest first. An array shows as one row (its parent, with element counts)."""
        return super().list(request, *args, **kwargs)

    @extend_schema(request=JobSpec, responses={201: JobSerializer}, examples=JOB_EXAMPLES)
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Submit a job (JSON, or YAML with Content-Type: application/yaml)."""
        job = submit_job(request.user, request.data)  # SpecError: 400 (api/errors.py)
        return answer_submitted(lambda: show_new_job(job), job, "jobs")

    def _request(self, action_name: str) -> Response:
        try:
            job = operations.request_job_action(self.get_object(), action_name, self.request.user)
        except operations.OperationError as exc:
            return conflict(exc)
        data = JobSerializer(self.get_queryset().get(pk=job.pk)).data
        return Response(data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return self._request("cancel")

    @extend_schema(request=None, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, pk: str) -> Response:
        return self._request("suspend")

    @extend_schema(request=None, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        return self._request("resume")

    @extend_schema(request=ExtendRequest, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        """Add to a running job's walltime, up to its queue's max_walltime, when no waiting
        job's reservation would start later for it (else 409 naming that job)."""
        seconds = extend_seconds(request.data)  # SpecError: 400 naming `by`
        try:
            job = extend_walltime(self.get_object(), seconds, request.user)
        except ExtendRefused as exc:
            return conflict(exc)
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(responses=EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str) -> Response:
        return paginated_events(self, Event.objects.filter(job=self.get_object()))

    @extend_schema(
        parameters=[
            OpenApiParameter("task", int, description="only this task's output"),
            OpenApiParameter("attempt", int, description="this attempt (default: the latest)"),
            OpenApiParameter("after", int, description="output after this byte offset"),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> Response:
        """Each task's output, in order, for one attempt."""
        job = self.get_object()
        params: dict[str, int] = {}
        for name in ("task", "attempt", "after"):
            raw = request.query_params.get(name)
            if raw is None or raw == "":
                continue
            try:
                params[name] = int(raw)
            except ValueError:
                raise ValidationError({name: [f"must be a whole number, got {raw!r}"]}) from None
            if not 0 <= params[name] <= MAX_QUERY_INT:
                raise ValidationError({name: [f"must be between 0 and {MAX_QUERY_INT}"]})
        tasks = list(job.tasks.order_by("group", "index"))
        if "task" in params:
            tasks = [t for t in tasks if t.pk == params["task"]]
            if not tasks:
                raise ValidationError({"task": [f"job {job.pk} has no task {params['task']}"]})
        after = params.get("after", 0)
        texts = logs.text_after(tasks, after, params.get("attempt"))
        out = []
        for task in tasks:
            text, end = texts[task.pk]
            out.append(
                {
                    "id": task.pk,
                    "group": task.group,
                    "index": task.index,
                    "attempt": params.get("attempt", task.attempt),
                    "data": text,
                    "next_offset": end,
                }
            )
        return Response({"job": job.pk, "tasks": out})


class FlowFilter(filters.FilterSet):
    state = choice_filter(FlowState.choices, "flow state")
    owner = filters.CharFilter(field_name="owner__username")

    class Meta:
        model = Flow
        fields = ["state", "owner"]


class FlowViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Flow],
):
    serializer_class = FlowSerializer
    filterset_class = FlowFilter
    list_actions = ("events",)

    def get_queryset(self) -> QuerySet[Flow]:
        return (
            Flow.objects.visible_to(self.request.user)
            .select_related("owner")
            .prefetch_related(
                "steps__template",
                Prefetch(
                    "jobs",
                    queryset=Job.objects.only(
                        "id", "flow_id", "step_id", "state", "hold_reason", "pending_message"
                    ),
                ),
            )
        )

    @extend_schema(request=FlowSpec, responses={201: FlowSerializer}, examples=FLOW_EXAMPLES)
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Start a flow (JSON or YAML). Its jobs are created by the scheduler loop."""
        flow = create_flow(request.user, request.data)
        return answer_submitted(
            lambda: self.get_serializer(self.get_queryset().get(pk=flow.pk)).data, flow, "flows"
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a finished flow with its own jobs (never another flow's)."""
        flow = self.get_object()
        if flow.state not in FLOW_FINAL:
            return conflict(Exception(f"flow {flow.pk} is {flow.state}: cancel it first"))
        flow.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: FlowSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        try:
            flow = operations.request_flow_cancel(self.get_object(), request.user)
        except operations.OperationError as exc:
            return conflict(exc)
        data = self.get_serializer(self.get_queryset().get(pk=flow.pk)).data
        return Response(data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str) -> Response:
        return paginated_events(self, Event.objects.filter(flow=self.get_object()))


class EventFilter(filters.FilterSet):
    node = filters.CharFilter(field_name="node__name")
    kind = filters.CharFilter()

    class Meta:
        model = Event
        fields = ["node", "kind"]


class EventViewSet(viewsets.ReadOnlyModelViewSet[Event]):
    """The audit trail: events of the user's own jobs and flows and of the cluster (nodes).
    `?job=` and `?flow=` of a job or flow the user cannot see answer 404 exactly as the job
    or flow itself does, so they never tell whether it exists."""

    serializer_class = EventSerializer
    filterset_class = EventFilter
    extra_query_params = ("job", "flow")

    @extend_schema(
        parameters=[
            OpenApiParameter("job", int, description="only this job's events (404 if unseen)"),
            OpenApiParameter("flow", int, description="only this flow's events (404 if unseen)"),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Event]:
        events = Event.visible_to(self.request.user).select_related("node")
        if self.action != "list":
            return events
        owners: dict[str, QuerySet[Any]] = {
            "job": Job.objects.visible_to(self.request.user),
            "flow": Flow.objects.visible_to(self.request.user),
        }
        for name, visible in owners.items():
            raw = self.request.query_params.get(name, "")
            if raw == "":
                continue
            if not (raw.isascii() and raw.isdigit()):
                raise ValidationError({name: [f"must be a {name} id (a whole number)"]})
            pk = int(raw) if len(raw) <= len(str(MAX_QUERY_INT)) else MAX_QUERY_INT + 1
            if pk > MAX_QUERY_INT or not visible.filter(pk=pk).exists():
                raise Http404(f"No {name.capitalize()} matches the given query.")
            events = events.filter(**{f"{name}_id": pk})
        return events
