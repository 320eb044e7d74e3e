"""How the API shows Berth's objects. Writes go through scheduler/intake/specs.py and
scheduler/jobs/submit.py, so a spec is validated the same way everywhere (REST, forms, flows)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as ModelValidationError
from django.db import models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduler.api.schema import FlowSpecJSON, JobSpecJSON, TemplateJobSpecJSON
from scheduler.core.quantity import (
    format_cpu,
    format_memory,
    parse_cpu,
    parse_gpu,
    parse_memory,
)
from scheduler.core.status import Code
from scheduler.flows.explain import step_wait_reasons
from scheduler.intake.specs import label_problems
from scheduler.jobs.arrays import indices_by_state
from scheduler.models import Event, Flow, Job, JobTemplate, Node, Queue, Task
from scheduler.ops.accounting import usage_by_attempt, usage_view
from scheduler.states.names import JobState

PARSERS = {"cpu": parse_cpu, "memory": parse_memory, "gpu": parse_gpu}
FORMATS: dict[str, Callable[[int], Any]] = {"cpu": format_cpu, "memory": format_memory, "gpu": int}


def check_model(instance: models.Model, attrs: dict[str, Any]) -> None:
    """The model's own rules (field validators and clean(), which the admin and commands run
    too) on the object as it would be saved: REST can never store what they refuse."""
    for key, value in attrs.items():
        setattr(instance, key, value)
    try:
        instance.full_clean(validate_unique=False, validate_constraints=False)
    except ModelValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from None


def show_resources(data: dict[str, Any] | None) -> dict[str, Any] | None:
    if data is None:
        return None
    return {k: (FORMATS[k](v) if v is not None else None) for k, v in data.items() if k in FORMATS}


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "number"}], "example": "1"})
class QuantityField(serializers.Field):  # type: ignore[type-arg]
    """A cpu or memory quantity as users write it (`"500m"`, `2`, `"16Gi"`), stored as an
    integer (millicores, bytes) and shown the way users write it."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        self.kind = kind
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        try:
            return int(PARSERS[self.kind](data))
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: int) -> Any:
        return FORMATS[self.kind](value)


class QueueSerializer(serializers.ModelSerializer[Queue]):
    capability = serializers.JSONField(required=False, allow_null=True)
    default_cpu = QuantityField("cpu", required=False, help_text="cpu a task gets when its "
                                "spec names none (default 1)")  # fmt: skip
    default_memory = QuantityField("memory", required=False, help_text="memory a task gets "
                                   "when its spec names none (default 1Gi)")  # fmt: skip
    max_user_running_cpus = QuantityField(
        "cpu", required=False, allow_null=True,
        help_text="cpu one user's running jobs may hold in this queue (null: unlimited)",
    )  # fmt: skip

    class Meta:
        model = Queue
        fields = ["name", "weight", "capability", "reclaimable", "priority", "max_user_priority",
                  "open", "default_cpu", "default_memory", "max_user_running_gpus",
                  "max_user_running_cpus", "max_user_running_jobs", "max_user_pending_jobs",
                  "user_limits_exempt_staff", "max_walltime", "gpu_sharing",
                  "interactive_idle_minutes", "interactive_gpu_idle_minutes", "staff_shell",
                  "created_at"]  # fmt: skip
        read_only_fields = ["created_at"]

    def validate_capability(self, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise serializers.ValidationError("must be a mapping with cpu, memory, gpu (or null)")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Capability as users write it ({"gpu": 16, "memory": "1Ti"}) -> stored integers;
        each bad entry is named by its path (`capability.gpu`)."""
        value = attrs.get("capability")
        if value is None:
            check_model(copy.copy(self.instance) if self.instance else Queue(), attrs)
            return attrs
        errors: dict[str, list[str]] = {}
        out: dict[str, int | None] = {}
        for key, raw in value.items():
            path = f"capability.{key}"
            if key not in PARSERS:
                errors[path] = [f"unknown resource (allowed: {', '.join(PARSERS)})"]
                continue
            if raw is None:  # unlimited in this dimension
                out[key] = None
                continue
            try:
                amount = PARSERS[key](raw)
            except ValueError as exc:
                errors[path] = [str(exc)]
                continue
            out[key] = amount
        if errors:
            raise serializers.ValidationError(errors)
        attrs = {**attrs, "capability": out}
        check_model(copy.copy(self.instance) if self.instance else Queue(), attrs)
        return attrs

    def to_representation(self, instance: Queue) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["capability"] = show_resources(instance.capability)
        return data


class NodeSerializer(serializers.ModelSerializer[Node]):
    cpu = serializers.SerializerMethodField()
    memory = serializers.SerializerMethodField()
    devices = serializers.SerializerMethodField()
    allocated = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "name", "state", "admin_state", "labels", "cpu", "memory", "devices", "allocated",
            "last_heartbeat", "hostname", "agent_version", "usage", "registered_at",
            "enforcement",
        ]  # fmt: skip
        read_only_fields = [f for f in fields if f != "labels"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "labels" in attrs and (problems := label_problems(attrs["labels"])):
            raise serializers.ValidationError(problems)  # by path: labels.zone
        if self.instance is not None:
            check_model(copy.copy(self.instance), attrs)
        return attrs

    def get_cpu(self, node: Node) -> str:
        return format_cpu(node.cpu)

    def get_memory(self, node: Node) -> str:
        return format_memory(node.memory)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_devices(self, node: Node) -> list[dict[str, Any]]:
        return [
            {
                "index": d.index,
                "uuid": d.uuid,
                "model": d.model,
                "healthy": d.healthy,
                "job": holders[0].task.job_id if holders else None,
                # Each task on it with its share (1 for a whole device): a shared GPU's
                # occupants.
                "occupants": [
                    {"job": a.task.job_id, "task": a.task_id, "share": a.share / 1000}
                    for a in holders
                ],
                # Its MIG instances (empty: not in MIG mode), each with the job holding it.
                "mig": [
                    {
                        "profile": m.profile,
                        "uuid": m.uuid,
                        "memory": m.memory,
                        "job": next((a.task.job_id for a in holders if a.mig == m.uuid), None),
                    }
                    for m in d.mig_instances.all()
                ],  # fmt: skip
            }
            for d in node.devices.all()
            for holders in [list(d.allocations.all())]
        ]

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_allocated(self, node: Node) -> dict[str, Any]:
        cpu = memory = gpu = 0
        for task in node.tasks.all():
            if task.state in ("Assigned", "Running"):
                cpu, memory, gpu = cpu + task.cpu, memory + task.memory, gpu + task.gpu
        return {"cpu": format_cpu(cpu), "memory": format_memory(memory), "gpu": gpu}


class TemplateSerializer(serializers.ModelSerializer[JobTemplate]):
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    spec = TemplateJobSpecJSON()

    class Meta:
        model = JobTemplate
        fields = ["name", "description", "spec", "owner", "created_at", "updated_at"]


class TaskSerializer(serializers.ModelSerializer[Task]):
    node: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    devices = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    gpu_sharing = serializers.SerializerMethodField()

    class Meta:
        model = Task
        fields = [
            "id", "group", "index", "node", "devices", "state", "exit_code", "attempt",
            "kill_requested", "message", "reason", "assigned_at", "started_at", "finished_at",
            "usage", "gpu_sharing",
        ]  # fmt: skip

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_usage(self, task: Task) -> dict[str, Any] | None:
        """What this attempt used once it ended, with its efficiency as seff shows it (null
        while it runs, or where nothing was recorded); the job's records are read once, and
        not at all while none of its tasks' current attempts has ended (a new job)."""
        if task.finished_at is None:  # a record is written when an attempt ends
            return None
        cache: dict[int, Any] = self.context.setdefault("usage_by_job", {})
        if task.job_id not in cache:
            cache[task.job_id] = usage_by_attempt([task.job_id])
        record = cache[task.job_id].get((task.pk, task.attempt))
        return None if record is None else usage_view(record)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_gpu_sharing(self, task: Task) -> dict[str, str] | None:
        """How it holds its GPU: `mode` (exclusive, mig, mps, timeslice) and the `isolation`
        that gives it from the other tasks on that GPU (null: no GPU, or a share not yet
        placed). docs/gpus.md."""
        return task.gpu_holding()

    def get_devices(self, task: Task) -> list[int]:
        """The GPUs it holds, or held: an ended task keeps its indices, not its allocations."""
        return task.gpu_indices()


class JobStatusSerializer(serializers.Serializer[dict[str, Any]]):
    """Why a job waits: a code (scheduler/core/status.py), a message for people and per node
    reason how many nodes gave it. NeverFits means waiting cannot help."""

    code = serializers.ChoiceField(choices=[str(c) for c in Code])
    message = serializers.CharField()
    node_reasons = serializers.DictField(child=serializers.IntegerField())


class JobSerializer(serializers.ModelSerializer[Job]):
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    queue: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    template: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    step: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    tasks = TaskSerializer(many=True, read_only=True)
    status = serializers.SerializerMethodField()
    spec = JobSpecJSON(read_only=True)
    pending_reasons = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()
    priority_factors = serializers.SerializerMethodField()
    array = serializers.SerializerMethodField()
    estimate_basis = serializers.SerializerMethodField()
    walltime_ends_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="when a running job's walltime runs out (berth extend gives it more);"
        " null unless it runs with a walltime",
    )

    class Meta:
        model = Job
        fields = [
            "id", "name", "owner", "queue", "priority", "preemptible", "min_available",
            "walltime", "ttl_seconds_after_finished", "active_deadline_seconds", "max_retry",
            "retries", "labels", "spec", "state", "reason", "message", "status",
            "pending_reasons", "estimated_start_at", "estimate_basis", "queue_position",
            "priority_factors", "gpu_idle_since", "idle_warned_at", "idle_ends_at",
            "requested_action", "flow",
            "template", "step", "item_index", "array", "array_parent", "array_index",
            "tasks", "created_at", "started_at", "finished_at", "walltime_ends_at",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_array(self, job: Job) -> dict[str, Any] | None:
        """An array parent's summary (null for other jobs); see docs/arrays.md."""
        if not job.is_array:
            return None
        counts = job.array_counts or {}
        data: dict[str, Any] = {
            "spec": job.spec.get("array"),
            "size": job.array_size,
            "limit": job.array_limit,
            "counts": counts.get("states", {}),
            "held": counts.get("held", 0),
            "elements": f"/api/v1/jobs/?array={job.pk}",
        }
        if self.context.get("array_indices"):
            data["indices"] = indices_by_state(job)
        return data

    @extend_schema_field(
        serializers.ChoiceField(choices=["walltime", "prediction"], allow_null=True)
    )
    def get_estimate_basis(self, job: Job) -> str | None:
        """What `estimated_start_at` was planned by: jobs' walltimes, or runtime
        predictions (EASY++, docs/configuration.md); null without an estimate."""
        return job.estimate_basis

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_priority_factors(self, job: Job) -> dict[str, Any] | None:
        """The waiting job's priority and its named factors as the scheduler last ordered
        it ({"priority", "factors", "weighted"}, as `sprio`); null unless it waits."""
        if job.state not in (JobState.PENDING, JobState.SUSPENDED) or job.hold_reason:
            return None
        return job.priority_factors

    @extend_schema_field(serializers.IntegerField(allow_null=True, min_value=1))
    def get_queue_position(self, job: Job) -> int | None:
        """1 = next in its queue in the scheduler's order; null unless the job waits there."""
        if job.state not in (JobState.PENDING, JobState.SUSPENDED) or job.hold_reason:
            return None
        return job.queue_position

    @extend_schema_field(JobStatusSerializer(allow_null=True))
    def get_status(self, job: Job) -> dict[str, Any] | None:
        """Why a pending or suspended job waits, null otherwise (codes: docs/cli.md)."""
        return job.status

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_pending_reasons(self, job: Job) -> list[str]:
        """Deprecated: `[status.message]` while the job waits (an array parent: its hold
        summary), else empty."""
        status = job.status
        if status:
            return [status["message"]]
        return [job.hold_reason] if job.hold_reason else []


class JobListSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = [f for f in JobSerializer.Meta.fields if f not in ("tasks", "spec")]
        read_only_fields = fields


class FlowSerializer(serializers.ModelSerializer[Flow]):
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    steps = serializers.SerializerMethodField()
    spec = FlowSpecJSON(read_only=True)

    class Meta:
        model = Flow
        fields = [
            "id", "name", "owner", "parallelism", "fail_fast", "ttl_seconds_after_finished",
            "spec", "state", "reason", "message", "cancel_requested", "steps",
            "created_at", "started_at", "finished_at",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_steps(self, flow: Flow) -> list[dict[str, Any]]:
        # Only this flow's own jobs, by foreign key: never another flow's (behaviour 1).
        all_jobs = list(flow.jobs.all())
        steps = list(flow.steps.all())
        by_id = {s.pk: s for s in steps}
        jobs: dict[int, list[int]] = {}
        earlier: dict[int, list[int]] = {}  # jobs of attempts before a retry that did not succeed
        for job in all_jobs:
            step = by_id.get(job.step_id or 0)
            if step is not None:
                (jobs if step.is_current(job) else earlier).setdefault(step.pk, []).append(job.pk)
        waiting = step_wait_reasons(flow, steps, all_jobs)
        return [
            {
                "name": step.name,
                "state": step.state,
                "template": step.template.name if step.template else None,
                "inline": step.template is None,
                "depends_on": step.depends_on,
                "items": len(step.items) if step.items else None,
                "message": step.message,
                "waiting": waiting[step.name],
                "jobs": sorted(jobs.get(step.pk, [])),
                "earlier_jobs": sorted(earlier.get(step.pk, [])),
            }
            for step in steps
        ]


class EventSerializer(serializers.ModelSerializer[Event]):
    node: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )

    class Meta:
        model = Event
        fields = ["id", "time", "kind", "reason", "message", "job", "flow", "node"]
        read_only_fields = fields
