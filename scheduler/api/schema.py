"""OpenAPI pieces drf-spectacular cannot work out by itself: how the schema (/api/schema/)
describes Berth's token authentications (imported by scheduler/api/urls.py and tokens.py), and
the typed job, template and flow specs (components JobSpec, TaskSpec, ResourcesSpec,
TemplateSpec, FlowSpec, FlowStepSpec, StepOverrides) with examples."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiExample, extend_schema_field
from rest_framework import serializers

from scheduler.core.quantity import MIG_PROFILE_RE


class _AuthorizationHeader(OpenApiAuthenticationExtension):
    """A key in the `Authorization` header; `description` says which and how it is written."""

    description = ""

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": self.description,
        }


class ApiTokenScheme(_AuthorizationHeader):
    target_class = "scheduler.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"
    description = (
        "`Token <key>` or `Bearer <key>`: a key from /api/v1/tokens/, the "
        "API tokens page or manage.py drf_create_token"
    )


class NodeTokenScheme(_AuthorizationHeader):
    """The agents' `Authorization: Node <token>` header, from `agent/register`."""

    target_class = "scheduler.agentapi.views.NodeTokenAuthentication"
    name = "nodeToken"
    description = 'The node token from agent/register, sent as "Node <token>".'


# --- the job, template and flow specs (request bodies; also the stored `spec` of answers) ---
# Used only to describe them: validation is scheduler/intake/specs.py's, the reference docs/spec.md.

DURATION_SCHEMA = {
    "oneOf": [
        {"type": "integer", "minimum": 0, "description": "whole seconds"},
        {"type": "string", "maxLength": 32, "example": "1h30m"},
    ],
    "description": 'whole seconds (90) or a duration: "90s", "1h30m", "2d", "30:00" (MM:SS), '
    '"01:30:00" (HH:MM:SS), "1-00:00:00" (Slurm\'s D-HH:MM:SS)',
}
QUANTITY_SCHEMA = {"oneOf": [{"type": "string", "maxLength": 32}, {"type": "number"}]}
# BERTH_MAX_PRIORITY as the schema was built (docs/limits.md).
MAX_PRIORITY = int(settings.BERTH_MAX_PRIORITY)
NAME_PATTERN = r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$"


# A spec's `gpu`: whole GPUs or part of one (a number), or a MIG profile (docs/gpus.md).
GPU_SCHEMA = {
    "oneOf": [
        {"type": "number", "minimum": 0, "maximum": 1024},
        {"type": "string", "pattern": MIG_PROFILE_RE.pattern, "example": "1g.10gb"},
    ]
}


@extend_schema_field(GPU_SCHEMA)
class GpuRequestField(serializers.Field):  # type: ignore[type-arg]
    """GPUs per task: 2, 0.25, or a MIG profile "1g.10gb"."""


@extend_schema_field(DURATION_SCHEMA)
class DurationField(serializers.Field):  # type: ignore[type-arg]
    """Seconds or a duration string (scheduler/core/duration.py)."""


@extend_schema_field(QUANTITY_SCHEMA)
class SpecQuantityField(serializers.Field):  # type: ignore[type-arg]
    """A resource quantity as users write it: cpu `2`, `0.5`, `"500m"`; memory `"16Gi"`."""


def _name(help_text: str, **kwargs: Any) -> serializers.RegexField:
    return serializers.RegexField(NAME_PATTERN, max_length=63, help_text=help_text, **kwargs)


def _strings(help_text: str) -> serializers.DictField:
    return serializers.DictField(child=serializers.CharField(), required=False,
                                 help_text=help_text)  # fmt: skip


class ResourcesSpec(serializers.Serializer):  # type: ignore[type-arg]
    cpu = SpecQuantityField(
        required=False,
        help_text='cores per task: 2, 0.5 or "500m"; default: the queue\'s default_cpu (1)',
    )
    memory = SpecQuantityField(
        required=False,
        help_text='bytes per task: "512Mi", "16Gi", "1G"; default: the queue\'s default_memory '
        "(1Gi)",
    )
    gpu = GpuRequestField(
        required=False, default=0,
        help_text="GPUs per task: whole ones (0 ... 1024), part of one GPU (0.25: above 0,"
        ' below 1, in steps of 0.001), or a MIG instance by its profile ("1g.10gb")',
    )  # fmt: skip
    gpu_memory = SpecQuantityField(
        required=False,
        help_text='GPU memory with part of a GPU: "10Gi"; only a device with that much left',
    )


class TaskSpec(serializers.Serializer):  # type: ignore[type-arg]
    name = _name("the group's name, unique in the job; default `main` when the job has one "
                 "group (required otherwise)", required=False)  # fmt: skip
    replicas = serializers.IntegerField(required=False, min_value=1, default=1,
                                        help_text="identical tasks in this group")  # fmt: skip
    command = serializers.CharField(help_text="a shell command (run by the agent's shell)")
    env = _strings("environment variables (numbers and booleans are turned into strings)")
    resources = ResourcesSpec(required=False, help_text="per task of the group")
    node_selector = _strings("labels a node must carry, all of them")


class JobSpec(serializers.Serializer):  # type: ignore[type-arg]
    name = _name("the job's name (not unique)")
    queue = _name("an existing queue", required=False, default="default")
    priority = serializers.IntegerField(
        required=False, default=0, min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY,
        help_text="higher runs first and may preempt; non-staff at most the queue's "
        "max_user_priority",
    )  # fmt: skip
    preemptible = serializers.BooleanField(required=False, default=True)
    min_available = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="tasks that must start together (a gang); default: all",
    )
    walltime = DurationField(required=False, allow_null=True, help_text="run time limit of an "
                             "attempt; also what backfill plans with")  # fmt: skip
    active_deadline_seconds = DurationField(
        required=False, allow_null=True, help_text="limit from submission (pending time included)"
    )
    ttl_seconds_after_finished = DurationField(
        required=False, allow_null=True, help_text="delete the job this long after it finished"
    )
    max_retry = serializers.IntegerField(required=False, min_value=0, max_value=100, default=0)
    labels = _strings("your own labels (names starting `berth/` are Berth's)")
    array = serializers.CharField(
        required=False,
        max_length=1000,
        help_text='an array of jobs: "0-999", "1,3,5-9:2", "0-99%10" (at most 10 at once)',
    )
    notify = serializers.JSONField(
        required=False,
        help_text="events to be told of by email and webhook: a list or comma-separated string"
        " of begin, end, fail, time_limit_90, time_limit_80, time_limit_50, time_limit_10m,"
        " time_limit_1m, or {events, email,"
        " webhook}; the webhook's host must be one staff allow (docs/notifications.md)",
    )
    apps = serializers.JSONField(
        required=False,
        help_text="a web app the job runs, reached at /apps/<job>/ by its owner only: http"
        " (it sees paths without the prefix) or jupyter (it keeps them), or [{kind: ...}];"
        " its port is $BERTH_APP_PORT (docs/interactive.md)",
    )
    tasks = TaskSpec(many=True, help_text="task groups (at least one)")


class TemplateJobSpec(JobSpec):
    """A template's job: a job spec without `name` (the flow step names it) or `array`."""

    name = None  # type: ignore[assignment]
    array = None  # type: ignore[assignment]


class TemplateSpec(serializers.Serializer):  # type: ignore[type-arg]
    name = _name("the template's name, unique")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    spec = TemplateJobSpec(help_text="the job each step that names this template makes")


class StepOverrides(serializers.Serializer):  # type: ignore[type-arg]
    """A step's changes to its template's job: job fields, and task fields for every group."""

    priority = serializers.IntegerField(
        required=False, min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY
    )
    queue = _name("an existing queue", required=False)
    walltime = DurationField(required=False, allow_null=True)
    active_deadline_seconds = DurationField(required=False, allow_null=True)
    max_retry = serializers.IntegerField(required=False, min_value=0, max_value=100)
    preemptible = serializers.BooleanField(required=False)
    min_available = serializers.IntegerField(required=False, min_value=1)
    command = serializers.CharField(required=False)
    env = _strings("merged over each group's env")
    resources = ResourcesSpec(required=False, help_text="merged over each group's resources")
    node_selector = _strings("replaces each group's node_selector")
    replicas = serializers.IntegerField(required=False, min_value=1)


class FlowStepSpec(serializers.Serializer):  # type: ignore[type-arg]
    name = _name("the step's name, unique in the flow")
    template = _name("an existing job template (or `spec`)", required=False)
    spec = TemplateJobSpec(
        required=False, help_text="an inline job spec without name, instead of template"
    )
    depends_on = serializers.ListField(child=serializers.CharField(), required=False,
                                       help_text="steps that must succeed first")  # fmt: skip
    overrides = StepOverrides(required=False)
    items = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()), required=False,
        allow_null=True, help_text="fan out: one job per item, its keys as env variables",
    )  # fmt: skip


class FlowSpec(serializers.Serializer):  # type: ignore[type-arg]
    name = _name("the flow's name")
    parallelism = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="at most this many jobs at once"
    )
    fail_fast = serializers.BooleanField(
        required=False,
        default=False,
        help_text="at the first failed job start no new job (waiting steps are skipped)",
    )
    ttl_seconds_after_finished = DurationField(required=False, allow_null=True)
    steps = FlowStepSpec(many=True, help_text="a DAG by depends_on (at least one)")


@extend_schema_field(JobSpec)
class JobSpecJSON(serializers.JSONField):
    """A stored job spec (normalized: durations in seconds, every resource given)."""


@extend_schema_field(TemplateJobSpec)
class TemplateJobSpecJSON(serializers.JSONField):
    """A template's stored job spec."""


@extend_schema_field(FlowSpec)
class FlowSpecJSON(serializers.JSONField):
    """A stored flow spec."""


JOB_EXAMPLES = [
    OpenApiExample("a simple job", request_only=True, value={
        "name": "hello", "tasks": [{"command": "echo hello", "resources": {"cpu": 1}}]}),
    OpenApiExample("a GPU gang", request_only=True, value={
        "name": "ddp", "queue": "default", "walltime": "1h30m", "min_available": 2,
        "tasks": [{"name": "worker", "replicas": 2, "command": "torchrun train.py",
                   "resources": {"cpu": 8, "memory": "32Gi", "gpu": 4}}]}),
    OpenApiExample("an array with retries", request_only=True, value={
        "name": "sweep", "array": "0-99%10", "max_retry": 2, "walltime": "01:00:00",
        "ttl_seconds_after_finished": "1d",
        "tasks": [{"command": "python sweep.py --index $BERTH_ARRAY_INDEX"}]}),
]  # fmt: skip
FLOW_EXAMPLES = [
    OpenApiExample("a flow with a fan-out", request_only=True, value={
        "name": "pipeline", "parallelism": 4,
        "steps": [{"name": "prepare", "template": "prepare"},
                  {"name": "train", "template": "train", "depends_on": ["prepare"],
                   "items": [{"LR": "0.1"}, {"LR": "0.01"}]}]}),
]  # fmt: skip
TEMPLATE_EXAMPLES = [
    OpenApiExample("a template", request_only=True, value={
        "name": "train", "description": "one GPU training run",
        "spec": {"walltime": "2h", "tasks": [{"command": "python train.py --lr $LR",
                                              "resources": {"gpu": 1}}]}}),
]  # fmt: skip


class ExtendRequest(serializers.Serializer):  # type: ignore[type-arg]
    by = serializers.CharField(
        help_text="how much longer: a duration (30m, 1h30m, 01:30:00) or seconds"
    )
