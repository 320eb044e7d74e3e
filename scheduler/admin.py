"""The operator's console: every model, with the columns, filters and actions an operator
needs. State changes go through scheduler/jobs/operations.py, as they do from the API."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from scheduler.core.quantity import format_cpu, format_memory
from scheduler.jobs import operations
from scheduler.models import (
    Allocation,
    ApiToken,
    Device,
    Event,
    Flow,
    FlowStep,
    Job,
    JobTemplate,
    Node,
    Outbox,
    Queue,
    Task,
    TaskLog,
    UsageRecord,
    UserShare,
)


def _apply(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, objects: QuerySet[Any], fn: Any
) -> None:
    done = failed = 0
    for obj in objects:
        try:
            fn(obj, request.user)
            done += 1
        except operations.OperationError as exc:
            failed += 1
            modeladmin.message_user(request, f"{obj}: {exc}", messages.WARNING)
    modeladmin.message_user(request, f"{done} done, {failed} refused")


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin[Queue]):
    list_display = ["name", "weight", "capability", "reclaimable", "priority",
                    "max_user_priority", "open", "max_user_running_gpus",
                    "max_user_running_cpus", "max_user_running_jobs", "max_user_pending_jobs",
                    "user_limits_exempt_staff"]  # fmt: skip
    list_filter = ["open", "reclaimable"]
    search_fields = ["name"]


@admin.register(UserShare)
class UserShareAdmin(admin.ModelAdmin[UserShare]):
    list_display = ["user", "account", "shares"]
    search_fields = ["user__username", "account"]
    raw_id_fields = ["user"]


class DeviceInline(admin.TabularInline[Device, Node]):
    model = Device
    extra = 0
    fields = ["index", "uuid", "model", "memory", "healthy", "holder", "mig"]
    readonly_fields = ["holder", "mig"]

    @admin.display(description="held by task")
    def holder(self, device: Device) -> str:
        held = [f"{a.task} ({a.share / 1000:g})" for a in device.allocations.all() if not a.mig]
        return ", ".join(held) or "-"

    @admin.display(description="MIG instances (as its agent found them)")
    def mig(self, device: Device) -> str:
        holders = {a.mig: a.task for a in device.allocations.all() if a.mig}
        instances = [
            f"{m.profile} {m.uuid}" + (f" held by {holders[m.uuid]}" if m.uuid in holders else "")
            for m in device.mig_instances.all()
        ]
        return ", ".join(instances) or "-"


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = ["name", "state", "admin_state", "cpu_cores", "memory_size", "gpus",
                    "last_heartbeat", "hostname"]  # fmt: skip
    list_filter = ["state", "admin_state"]
    search_fields = ["name", "hostname"]
    readonly_fields = ["state", "last_heartbeat", "token_hash", "usage", "registered_at",
                       "agent_version", "hostname"]  # fmt: skip
    inlines = [DeviceInline]
    actions = ["cordon", "uncordon", "drain", "reset_token"]

    @admin.display(description="cpu")
    def cpu_cores(self, node: Node) -> str:
        return format_cpu(node.cpu)

    @admin.display(description="memory")
    def memory_size(self, node: Node) -> str:
        return format_memory(node.memory)

    @admin.display(description="GPUs")
    def gpus(self, node: Node) -> int:
        return node.devices.count()

    def delete_model(self, request: HttpRequest, obj: Node) -> None:
        """Its tasks end Lost and their jobs follow their retry policy, as from the API."""
        operations.delete_node(obj, request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            operations.delete_node(node, request.user)

    @admin.action(description="Cordon: place no new tasks")
    def cordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _apply(self, request, queryset, operations.cordon_node)

    @admin.action(description="Uncordon: schedulable again")
    def uncordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _apply(self, request, queryset, operations.uncordon_node)

    @admin.action(description="Drain: no new tasks, let running jobs finish")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _apply(self, request, queryset, operations.drain_node)

    @admin.action(description="Reset token: the next agent joining with this name takes it")
    def reset_token(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        _apply(self, request, queryset, operations.reset_node_token)


@admin.register(JobTemplate)
class JobTemplateAdmin(admin.ModelAdmin[JobTemplate]):
    list_display = ["name", "description", "owner", "updated_at"]
    search_fields = ["name", "description"]


class TaskInline(admin.TabularInline[Task, Job]):
    model = Task
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "group", "index", "state", "node", "devices", "exit_code", "attempt",
        "kill_requested", "started_at", "finished_at",
    )  # fmt: skip

    @admin.display(description="devices")
    def devices(self, task: Task) -> str:
        return ",".join(str(a.device.index) for a in task.allocations.select_related("device"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin[Job]):
    list_display = ["id", "name", "owner", "queue", "priority", "state", "reason",
                    "flow", "step", "created_at", "finished_at"]  # fmt: skip
    list_filter = ["state", "queue", "preemptible"]
    search_fields = ["name", "owner__username", "=id"]
    list_select_related = ["owner", "queue", "flow", "step"]
    date_hierarchy = "created_at"
    readonly_fields = ["state", "terminal_state", "reason", "message", "pending_code",
                       "pending_message",
                       "estimated_start_at", "requested_action", "requested_at", "hold_reason",
                       "retries", "flow", "step", "item_index", "template", "labels", "spec",
                       "array_parent", "array_index", "array_size", "array_counts",
                       "created_at", "started_at", "finished_at"]  # fmt: skip
    inlines = [TaskInline]
    actions = ["cancel", "suspend", "resume"]

    @admin.action(description="Cancel the selected jobs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _apply(self, request, queryset, lambda j, u: operations.request_job_action(j, "cancel", u))

    @admin.action(description="Suspend the selected jobs")
    def suspend(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _apply(self, request, queryset, lambda j, u: operations.request_job_action(j, "suspend", u))

    @admin.action(description="Resume the selected jobs")
    def resume(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _apply(self, request, queryset, lambda j, u: operations.request_job_action(j, "resume", u))


class FlowStepInline(admin.TabularInline[FlowStep, Flow]):
    model = FlowStep
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "position", "name", "template", "spec", "depends_on", "items", "state", "message",
    )  # fmt: skip

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Flow)
class FlowAdmin(admin.ModelAdmin[Flow]):
    list_display = ["id", "name", "owner", "state", "parallelism", "fail_fast", "created_at",
                    "finished_at"]  # fmt: skip
    list_filter = ["state", "fail_fast"]
    search_fields = ["name", "owner__username", "=id"]
    list_select_related = ["owner"]
    readonly_fields = ["state", "reason", "message", "cancel_requested", "spec", "created_at",
                       "started_at", "finished_at"]  # fmt: skip
    inlines = [FlowStepInline]
    actions = ["cancel"]

    @admin.action(description="Cancel the selected flows")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Flow]) -> None:
        _apply(self, request, queryset, operations.request_flow_cancel)


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin[Task]):
    list_display = ["id", "job", "group", "index", "state", "node", "exit_code", "attempt"]
    list_filter = ["state"]
    search_fields = ["=job__id", "job__name", "node__name"]
    list_select_related = ["job", "node"]
    readonly_fields = [f.name for f in Task._meta.fields]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin[Allocation]):
    list_display = ["device", "task", "created_at"]
    list_select_related = ["device__node", "task"]
    readonly_fields = ["device", "task", "created_at"]


@admin.register(TaskLog)
class TaskLogAdmin(admin.ModelAdmin[TaskLog]):
    list_display = ["task", "attempt", "offset", "created_at"]
    list_select_related = ["task"]
    readonly_fields = ["task", "attempt", "offset", "data", "created_at"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin[Event]):
    list_display = ["time", "kind", "reason", "message", "job", "flow", "node"]
    list_filter = ["kind", "reason"]
    search_fields = ["message", "=job__id", "=flow__id", "node__name"]
    list_select_related = ["job", "flow", "node"]
    readonly_fields = ["time", "kind", "reason", "message", "job", "flow", "node"]


@admin.register(Outbox)
class OutboxAdmin(admin.ModelAdmin[Outbox]):
    """Notifications to deliver, delivered and given up (docs/notifications.md): read-only;
    a given-up row says why in `last_error`."""

    list_display = ["id", "kind", "channel", "job_ref", "user", "created_at", "attempts",
                    "next_attempt_at", "delivered_at", "gave_up_at"]  # fmt: skip
    list_filter = ["channel", "kind"]
    search_fields = ["=job_ref", "user__username", "target"]
    list_select_related = ["user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Staff see and revoke (delete) users' tokens; keys are made only by their owners."""

    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "expires_at"]
    search_fields = ["name", "user__username", "prefix"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin[UsageRecord]):
    """The accounting trail: read-only."""

    list_display = ["finished_at", "username", "queue", "job_id", "task_id", "attempt", "state",
                    "wall_seconds", "cpu_seconds", "gpu_seconds"]  # fmt: skip
    list_filter = ["queue", "state", "day"]
    search_fields = ["username", "=job_id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
