"""Berth's domain: queues, nodes and devices, templates, flows, jobs, tasks, allocations, events.

Resources are stored as integers: cpu in millicores, memory in bytes, gpu as whole devices.
Invariants the database can guarantee are constraints here (a device is held by at most one
task; names unique; resources non-negative), so no code path can break them.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q, QuerySet

from scheduler.agent import sharemodes
from scheduler.agent.wire import GPU_SHARING_MODES
from scheduler.core.status import Code
from scheduler.intake.specs import NAME_RE
from scheduler.states.names import (
    JOB_FINAL,
    PREEMPTED,
    FlowState,
    JobRequest,
    JobState,
    NodeState,
    StepState,
    TaskState,
)

NAME_HELP = (
    "lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit,"
    " at most 63 characters"
)
name_validator = RegexValidator(NAME_RE.pattern, f"must be {NAME_HELP}")  # the specs' rule
# The range a job's priority may take (scheduler/intake/specs.py refuses anything outside it).
PRIORITY_LIMIT = 1_000_000
priority_validators = [MinValueValidator(-PRIORITY_LIMIT), MaxValueValidator(PRIORITY_LIMIT)]

# Rules checked in clean() (so the admin, REST and commands refuse the same things) for what
# one bad row would otherwise break for everyone: the snapshot reads capabilities and labels.
CAPABILITY_UNITS = {"cpu": "millicores", "memory": "bytes", "gpu": "devices"}
CAPABILITY_MAX = 2**62
MAX_QUEUE_WEIGHT = 1e6
# What a task gets when its spec names no cpu or memory (docs/spec.md), and their bounds (those
# of a task's own request, scheduler/intake/specs.py RESOURCE_MAX).
DEFAULT_TASK_CPU = 1000  # millicores: 1 cpu
DEFAULT_TASK_MEMORY = 2**30  # bytes: 1Gi


def capability_problems(value: object) -> list[str]:
    """What is wrong with a stored capability: null, or {resource: whole number or null}."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return ['must be an object like {"gpu": 16, "memory": 1099511627776}, or null']
    problems = []
    for key, amount in value.items():
        if key not in CAPABILITY_UNITS:
            problems.append(f"{str(key)[:40]}: unknown resource (allowed: cpu, memory, gpu)")
        elif amount is not None and (
            isinstance(amount, bool)
            or not isinstance(amount, int)
            or not 0 <= amount <= CAPABILITY_MAX
        ):
            problems.append(
                f"{key}: must be a whole number of {CAPABILITY_UNITS[key]} up to 2^62, or null;"
                f" got {repr(amount)[:40]}"
            )
    return problems


class OwnedQuerySet(QuerySet[Any]):
    def visible_to(self, user: Any) -> OwnedQuerySet:
        """What `user` may see: staff see all, others their own, anonymous nothing."""
        if not user or not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self
        return self.filter(owner=user)


class Queue(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[name_validator])
    weight = models.FloatField(default=1.0)
    # Max resources the queue's running jobs may hold: {"cpu": milli, "memory": bytes, "gpu": n};
    # a missing key or null means unlimited in that dimension.
    capability = models.JSONField(null=True, blank=True)
    reclaimable = models.BooleanField(default=True)
    priority = models.IntegerField(default=0)
    # The highest job priority a non-staff user may ask for in this queue (as Slurm lets users
    # only lower theirs); staff may set any. Preemption follows priority, so it follows this.
    max_user_priority = models.IntegerField(
        default=0,
        validators=priority_validators,
        help_text="the highest job priority non-staff users may ask for; staff may set any",
    )
    open = models.BooleanField(default=True)
    # Per-user limits in this queue (null: unlimited), as Slurm's MaxTRESPerUser,
    # MaxJobsPerUser and MaxSubmitJobsPerUser: a job that would take its owner past a running
    # limit waits (UserLimit); a submission past the pending limit is refused with a 400.
    max_user_running_gpus = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(10**6)],
        help_text="GPUs one user's running jobs may hold in this queue; empty: unlimited",
    )  # fmt: skip
    max_user_running_cpus = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(10**12)],
        help_text="millicores one user's running jobs may hold in this queue; empty: unlimited",
    )  # fmt: skip
    max_user_running_jobs = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(10**7)],
        help_text="jobs one user may run at once in this queue; empty: unlimited",
    )  # fmt: skip
    max_user_pending_jobs = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(10**7)],
        help_text="jobs (array elements each) one user may have waiting here; empty: unlimited",
    )  # fmt: skip
    user_limits_exempt_staff = models.BooleanField(
        default=False, help_text="staff users are not held to the per-user limits"
    )
    # As Slurm's partition MaxTime: no job here asks for more (a job naming none gets it),
    # and `berth extend` goes no further (docs/interactive.md#time-limits-and-extending).
    max_walltime = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="seconds: the longest walltime a job here may have, extensions included;"
        " a job naming none gets this (empty: no maximum)",
    )  # fmt: skip
    # The GPU sharing modes this queue's fractions may use (null: every mode a node offers).
    gpu_sharing = models.JSONField(
        null=True, blank=True, help_text='GPU sharing modes allowed for fractions, e.g.'
        ' ["mps", "timeslice"] (null: all)'
    )  # fmt: skip
    default_cpu = models.BigIntegerField(
        default=DEFAULT_TASK_CPU,
        validators=[MinValueValidator(0), MaxValueValidator(10**9)],
        help_text="millicores a task gets when its spec names no cpu",
    )
    default_memory = models.BigIntegerField(
        default=DEFAULT_TASK_MEMORY,
        validators=[MinValueValidator(0), MaxValueValidator(2**60)],
        help_text="bytes of memory a task gets when its spec names no memory",
    )
    # Terminal sessions (docs/interactive.md): one with no input for this long ends, and an
    # interactive job whose last session ended with it unless it asked to persist; 0: never.
    interactive_idle_minutes = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0), MaxValueValidator(10**6)],
        help_text="a terminal session with no input for this long ends (0: never)",
    )
    # Interactive GPU sessions (scheduler/ops/idle_sessions.py, docs/interactive.md): an
    # interactive job whose GPUs are idle and whose terminals get no input for this long is
    # warned, and ended (GpuIdleTimeout) when still idle BERTH_IDLE_SESSION_GRACE_MINUTES
    # later; 0: never. Batch jobs are only flagged (BERTH_GPU_IDLE_MINUTES), never ended.
    interactive_gpu_idle_minutes = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0), MaxValueValidator(10**6)],
        help_text="an interactive job holding GPUs idle (below 1 %) with no terminal input for"
        " this long is warned, then ended after the grace period (0: never)",
    )
    staff_shell = models.BooleanField(
        default=False,
        help_text="staff may open terminal sessions in other users' running jobs here",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(weight__gt=0), name="queue_weight_positive")
        ]

    def __str__(self) -> str:
        return self.name

    def priority_cap_for(self, user: Any) -> int | None:
        """The highest priority `user` may give a job in this queue; None: no cap (staff)."""
        if getattr(user, "is_staff", False):
            return None
        return self.max_user_priority

    def priority_refusal(self, user: Any, priority: int) -> str:
        """Why `user` may not ask for `priority` here, or "" when they may."""
        cap = self.priority_cap_for(user)
        if cap is None or priority <= cap:
            return ""
        return f'at most {cap} in queue "{self.name}" for non-staff users, got {priority}'

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if problems := capability_problems(self.capability):
            errors["capability"] = problems
        if not 0 < self.weight <= MAX_QUEUE_WEIGHT:  # also refuses NaN
            errors["weight"] = [f"must be greater than 0 and at most {MAX_QUEUE_WEIGHT:g}"]
        if problems := sharing_problems(self.gpu_sharing, allow_null=True):
            errors["gpu_sharing"] = problems
        if errors:
            raise ValidationError(errors)


def sharing_problems(value: object, *, allow_null: bool = False) -> list[str]:
    """What is wrong with a list of GPU sharing modes ([] when nothing)."""
    if value is None and allow_null:
        return []
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        return [f"must be a list of modes from {', '.join(GPU_SHARING_MODES)}"]
    unknown = sorted({m for m in value if m not in GPU_SHARING_MODES})
    if unknown:
        return [f"unknown mode {unknown[0][:20]!r} (known: {', '.join(GPU_SHARING_MODES)})"]
    return []


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Node(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[name_validator])
    labels = models.JSONField(default=dict, blank=True)
    cpu = models.BigIntegerField(help_text="millicores")
    memory = models.BigIntegerField(help_text="bytes")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    # What an operator asked for (cordon/drain), kept apart from health so that a node that
    # goes NotReady and comes back is still cordoned.
    admin_state = models.CharField(
        max_length=16,
        choices=[("", "Schedulable")]
        + [(s.value, s.label) for s in (NodeState.CORDONED, NodeState.DRAINING, NodeState.DRAINED)],
        default="",
        blank=True,
    )
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    token_hash = models.CharField(max_length=64, unique=True, null=True, blank=True, editable=False)
    agent_version = models.CharField(max_length=64, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    # The address the agent registered from, as the server saw it: where the app proxy
    # (berth/web/appproxy.py) connects for this node's jobs' apps. The agent cannot name another.
    address = models.GenericIPAddressField(null=True, blank=True, editable=False)
    usage = models.JSONField(default=dict, blank=True)  # last usage the agent reported
    # What the agent enforces on its tasks, as it said when it registered
    # (scheduler/agent/fence.py: mode, cgroup, enforced, missing, problem, pids_limit). A
    # `problem` keeps the node NotReady: an agent with --enforce required runs nothing then.
    enforcement = models.JSONField(default=dict, blank=True)
    # The GPU sharing modes the node's agent offers ("mig", "mps", "timeslice"): fractions
    # of a GPU go only to nodes offering one (docs/gpus.md).
    gpu_sharing = models.JSONField(default=list, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    # When the agent's GPU samples were last kept (scheduler/ops/gpu_history.py keeps at most one
    # per BERTH_GPU_SAMPLE_SECONDS, however often the agent renews its lease).
    gpu_sampled_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(cpu__gte=0), name="node_cpu_nonnegative"),
            models.CheckConstraint(condition=Q(memory__gte=0), name="node_memory_nonnegative"),
        ]
        indexes = [models.Index(fields=["state", "last_heartbeat"], name="node_state_heartbeat")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from scheduler.intake.specs import label_problems

        if problems := label_problems(self.labels):
            raise ValidationError(
                {"labels": [f"{p}: {m}" for p, ms in problems.items() for m in ms]}
            )

    def issue_token(self) -> str:
        """Make a new node token; only its hash is kept."""
        token = secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        return token

    def derive_state(self, alive: bool) -> str:
        """The shown state: NotReady when the agent is silent, else the operator's choice."""
        if not alive or self.enforcement_problem():
            return NodeState.NOT_READY
        return self.admin_state or NodeState.READY

    def enforcement_problem(self) -> str:
        """Why this node's agent runs nothing ("" when it runs tasks)."""
        info = self.enforcement if isinstance(self.enforcement, dict) else {}
        problem = info.get("problem")
        return problem if isinstance(problem, str) else ""


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=128, blank=True)
    memory = models.BigIntegerField(default=0, help_text="bytes")
    healthy = models.BooleanField(default=True)

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="device_unique_index_per_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class MigInstance(models.Model):
    """One MIG instance of a GPU, as its agent found it through NVML when it registered (the
    administrator makes them; Berth only reads them). A task asking for its profile may hold
    it alone (`Allocation.mig`)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="mig_instances")
    uuid = models.CharField(max_length=128)
    profile = models.CharField(max_length=32, help_text='e.g. "1g.10gb"')
    memory = models.BigIntegerField(default=0, help_text="bytes")
    gpu_instance = models.PositiveIntegerField(default=0)
    compute_instance = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["device_id", "uuid"]
        constraints = [
            models.UniqueConstraint(fields=["device", "uuid"], name="miginstance_unique_uuid"),
        ]

    def __str__(self) -> str:
        return f"{self.device} {self.profile} {self.uuid}"


class DeviceSample(models.Model):
    """One GPU's utilisation and memory in use at one time (server time), as its agent sent
    them with a lease renewal. Kept for BERTH_GPU_HISTORY_SECONDS: the scheduler loop deletes
    older ones (scheduler/ops/gpu_history.py)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples")
    time = models.DateTimeField()
    utilization = models.PositiveSmallIntegerField(help_text="percent")
    memory_used = models.BigIntegerField(help_text="bytes")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(utilization__lte=100) & Q(memory_used__gte=0),
                name="devicesample_in_range",
            ),
        ]
        indexes = [
            # The node and job charts read each device's samples over a window.
            models.Index(fields=["device", "time"], name="devicesample_device_time"),
            # The scheduler loop's prune deletes by age.
            models.Index(fields=["time"], name="devicesample_time"),
        ]

    def __str__(self) -> str:
        return f"device {self.device_id} at {self.time}: {self.utilization}%"


class JobTemplate(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[name_validator])
    description = models.TextField(blank=True)
    spec = models.JSONField(help_text="a job spec without name")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The spec must make a valid job (the flow controller builds step jobs from it) in a
        queue that exists; it is stored normalized, as REST stores it."""
        from scheduler.intake.specs import SpecError, normalize_template_spec

        # The name is checked by its own field; a fixed one keeps it out of these errors.
        data = {"name": "template", "description": self.description or "", "spec": self.spec}
        try:
            normalized = normalize_template_spec(data)
        except SpecError as exc:
            errors: dict[str, list[str]] = {}
            for path, messages in exc.errors.items():
                field = "description" if path == "description" else "spec"
                errors.setdefault(field, []).extend(f"{path}: {m}" for m in messages)
            raise ValidationError(errors) from None
        queue = normalized["spec"]["queue"]
        if not Queue.objects.filter(name=queue).exists():
            raise ValidationError({"spec": [f'queue: unknown queue "{queue}"']})
        self.spec = normalized["spec"]


class Flow(models.Model):
    name = models.CharField(max_length=63, validators=[name_validator])
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="flows"
    )
    spec = models.JSONField()
    parallelism = models.PositiveIntegerField(null=True, blank=True, help_text="null: unlimited")
    fail_fast = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=FlowState.choices, default=FlowState.PENDING)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    ttl_seconds_after_finished = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(parallelism__isnull=True) | Q(parallelism__gte=1),
                name="flow_parallelism_positive",
            )
        ]
        indexes = [
            models.Index(fields=["owner", "-id"], name="flow_owner"),
            # The flow controller reconciles active flows; TTL scans finished ones.
            models.Index(fields=["state", "finished_at"], name="flow_state_finished"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.pk})"


class FlowStep(models.Model):
    flow = models.ForeignKey(Flow, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=63, validators=[name_validator])
    position = models.PositiveIntegerField()
    # Exactly one of the two: a staff-made template, or the step's own (inline) job spec.
    template = models.ForeignKey(
        JobTemplate, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    spec = models.JSONField(null=True, blank=True, help_text="an inline job spec without name")
    depends_on = models.JSONField(default=list, blank=True)
    overrides = models.JSONField(default=dict, blank=True)
    items = models.JSONField(null=True, blank=True)  # list of env dicts, or null: one job
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    message = models.TextField(blank=True)
    # Set by a retry: this step's jobs with a smaller id that did not succeed belong to an
    # earlier attempt; the controller and pages leave them out (succeeded ones are kept).
    retried_below = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["flow_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["flow", "name"], name="flowstep_unique_name"),
            models.CheckConstraint(
                condition=Q(template__isnull=True, spec__isnull=False)
                | Q(template__isnull=False, spec__isnull=True),
                name="flowstep_template_or_spec",
            ),
        ]

    @property
    def job_spec(self) -> dict[str, Any]:
        """The spec this step's jobs start from: its template's, or its own."""
        if self.template is not None:
            return dict(self.template.spec)
        return dict(self.spec or {})

    def is_current(self, job: Any) -> bool:
        """Is `job` (one of this step's) part of the step's current attempt?"""
        return (
            self.retried_below is None or job.pk >= self.retried_below or job.state == "Succeeded"
        )

    def __str__(self) -> str:
        return f"{self.flow_id}/{self.name}"


class Job(models.Model):
    name = models.CharField(max_length=63, validators=[name_validator])
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs")
    priority = models.IntegerField(default=0)
    preemptible = models.BooleanField(default=True)
    min_available = models.PositiveIntegerField(default=1)
    spec = models.JSONField(help_text="the normalized job spec")
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    # Where a Terminating job goes once its tasks are confirmed stopped: a final state, or
    # Pending for a restart after a task failure (retries).
    terminal_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    # Why a pending job waits, as the scheduler last saw it (scheduler.core.status): a code,
    # a message for people and per node reason how many nodes gave it. Written by the store
    # only when code or message change; `status` reads them (with holds) for the API and pages.
    pending_code = models.CharField(max_length=32, blank=True)
    pending_message = models.TextField(blank=True)
    pending_node_reasons = models.JSONField(default=dict, blank=True)
    # The pending job's priority and its named factors as the scheduler last ordered it
    # (scheduler/cycle/fairshare.py): {"priority", "factors": {...}, "weighted": {...}}; null when
    # not waiting or the factors are off.
    priority_factors = models.JSONField(null=True, blank=True)
    # When a pending job should start: written by the planner, not by the status writer.
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    # 1 = next in its queue, in the scheduler's order (scheduler/cycle/planning.py); null when the
    # job does not wait in a queue (held, placed, running, finished).
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    requested_action = models.CharField(
        max_length=16, choices=JobRequest.choices, default=JobRequest.NONE, blank=True
    )
    requested_at = models.DateTimeField(null=True, blank=True)
    # Non-empty: the job may not be scheduled yet, e.g. "waiting for a parallelism slot" in its
    # flow. The store adapter leaves held jobs out of the snapshot.
    hold_reason = models.CharField(max_length=200, blank=True)
    walltime = models.PositiveIntegerField(null=True, blank=True, help_text="seconds")
    ttl_seconds_after_finished = models.PositiveIntegerField(null=True, blank=True)
    active_deadline_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_retry = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    flow = models.ForeignKey(
        Flow, on_delete=models.CASCADE, null=True, blank=True, related_name="jobs"
    )
    step = models.ForeignKey(
        FlowStep, on_delete=models.CASCADE, null=True, blank=True, related_name="jobs"
    )
    item_index = models.PositiveIntegerField(null=True, blank=True)
    template = models.ForeignKey(
        JobTemplate, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs"
    )
    # Job arrays (docs/arrays.md). A parent has array_size set and no tasks: it is held, never
    # scheduled, and its state and array_counts summarise its elements (scheduler/jobs/arrays.py).
    # An element is a real job with array_parent and its array_index.
    array_parent = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="array_elements"
    )
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_size = models.PositiveIntegerField(null=True, blank=True, help_text="parents only")
    array_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="parents only: at most this many elements active"
    )
    array_counts = models.JSONField(default=dict, blank=True, help_text="elements per state")
    # Set while the running job is flagged for holding GPUs idle (scheduler/ops/gpu_idle.py): since
    # when its idle task's GPUs have stayed below GPU_IDLE_PERCENT. Null: not flagged.
    gpu_idle_since = models.DateTimeField(null=True, blank=True, editable=False)
    # Set while a running interactive job is warned that it will be ended for holding GPUs
    # idle with no terminal input (scheduler/ops/idle_sessions.py): when it was warned, and
    # when it ends unless its GPUs or terminals are used first. Null: not warned.
    idle_warned_at = models.DateTimeField(null=True, blank=True, editable=False)
    idle_ends_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The owner's latest request through the app proxy (written at most every
    # webapps.USE_MARK_SECONDS): an app in use is not idle (lifecycle/idle_sessions.py).
    app_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(min_available__gte=1), name="job_min_available_positive"
            ),
            models.UniqueConstraint(
                fields=["array_parent", "array_index"], name="job_array_index_unique"
            ),
            models.CheckConstraint(
                condition=Q(array_limit__isnull=True) | Q(array_limit__gte=1),
                name="job_array_limit_positive",
            ),
        ]
        indexes = [
            # The store adapter loads active jobs by state every cycle.
            models.Index(fields=["state", "queue"], name="job_state_queue"),
            # Per-user pending limits (scheduler/jobs/submit.py): one owner's waiting jobs in a
            # queue.
            models.Index(
                fields=["owner", "queue"], condition=Q(state="Pending"), name="job_pending_owner"
            ),
            # The jobs page lists a user's jobs newest first.
            models.Index(fields=["owner", "-id"], name="job_owner"),
            # TTL cleanup scans finished jobs by finish time.
            models.Index(fields=["state", "finished_at"], name="job_state_finished"),
            models.Index(fields=["flow", "step"], name="job_flow_step"),
            # The plan resets the positions of jobs that left their queue (few rows).
            models.Index(
                fields=["queue_position"],
                condition=Q(queue_position__isnull=False),
                name="job_queued",
            ),
            # Array element counts per state (the arrays pass, the API's parent rows).
            models.Index(fields=["array_parent", "state"], name="job_array_state"),
            # The limit pass releases an array's held elements in index order.
            models.Index(
                fields=["array_parent", "array_index"],
                condition=~Q(hold_reason=""),
                name="job_array_held",
            ),
            # The arrays pass finds active parents each cycle without scanning elements.
            models.Index(
                fields=["state"], condition=Q(array_size__isnull=False), name="job_array_parents"
            ),
            # Each cycle looks for user requests (cancel/suspend/resume) still to carry out.
            models.Index(
                fields=["requested_action"],
                condition=~Q(requested_action=""),
                name="job_requested",
            ),
            # The GPU idle check and the cluster page read the flagged jobs (few rows).
            models.Index(
                fields=["gpu_idle_since"],
                condition=Q(gpu_idle_since__isnull=False),
                name="job_gpu_idle",
            ),
            # The idle-session check reads the warned jobs (few rows).
            models.Index(
                fields=["idle_warned_at"],
                condition=Q(idle_warned_at__isnull=False),
                name="job_idle_warned",
            ),
            # Job lists show top-level jobs (plain jobs and array parents) newest first.
            models.Index(
                fields=["owner", "-id"],
                condition=Q(array_parent__isnull=True),
                name="job_owner_top",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.pk})"

    def clean(self) -> None:
        """What a spec may ask (scheduler/intake/specs.py), for the fields the admin edits too."""
        from scheduler.intake.specs import job_field_problems, job_int_bounds

        errors = job_field_problems({key: getattr(self, key) for key in job_int_bounds()})
        if self.pk and not self.is_array and "min_available" not in errors:
            replicas = self.tasks.count()
            if replicas and self.min_available > replicas:
                errors["min_available"] = [
                    f"must be at most the total replicas ({replicas}), got {self.min_available}"
                ]
        if errors:
            raise ValidationError(errors)

    @property
    def is_finished(self) -> bool:
        return self.state in JOB_FINAL

    @property
    def walltime_ends_at(self) -> datetime | None:
        """When a running job's walltime runs out (it is stopped then); None otherwise."""
        if self.state != JobState.RUNNING or self.walltime is None or self.started_at is None:
            return None
        try:
            return self.started_at + timedelta(seconds=self.walltime)
        except OverflowError:
            return None

    @property
    def estimate_basis(self) -> str | None:
        """What the start estimate was planned by: "walltime" (running and waiting jobs
        end at their walltimes) or "prediction" (BERTH_RUNTIME_PREDICTIONS: at their
        owners' predicted run times); None without an estimate."""
        if self.estimated_start_at is None:
            return None
        return "prediction" if settings.BERTH_RUNTIME_PREDICTIONS else "walltime"

    @property
    def status(self) -> dict[str, Any] | None:
        """Why a pending or suspended job waits, as {code, message, node_reasons} (codes of
        scheduler.core.status), or None for other jobs and for one the scheduler has not
        looked at yet. A hold set outside the core (flow parallelism, an array's limit, a
        step's dependencies) comes first: the core never sees held jobs."""
        if self.state not in (JobState.PENDING, JobState.SUSPENDED):
            return None
        if self.hold_reason:  # a parallelism slot or an array's limit: its words say which
            return {"code": str(Code.HELD), "message": self.hold_reason, "node_reasons": {}}
        # A preempted job (reason states.PREEMPTED) resumes by itself: the core says why.
        if self.state == JobState.SUSPENDED and self.reason != PREEMPTED:
            message = self.message or "suspended until its owner resumes it"
            return {"code": str(Code.HELD), "message": message, "node_reasons": {}}
        if not self.pending_code:
            return None
        reasons = self.pending_node_reasons if isinstance(self.pending_node_reasons, dict) else {}
        return {"code": self.pending_code, "message": self.pending_message, "node_reasons": reasons}

    @property
    def is_array(self) -> bool:
        """An array parent: a summary row whose elements are the real jobs."""
        return self.array_size is not None

    @property
    def array_job_id(self) -> str:
        """Slurm's display id: "123_5" for element 5 of array 123, else the id."""
        if self.array_parent_id is not None:
            return f"{self.array_parent_id}_{self.array_index}"
        return str(self.pk)


class Task(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tasks")
    group = models.CharField(max_length=63)
    index = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.PENDING)
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks"
    )
    cpu = models.BigIntegerField(default=0, help_text="millicores")
    memory = models.BigIntegerField(default=0, help_text="bytes")
    gpu = models.PositiveIntegerField(default=0)
    # A fraction of one GPU, in thousandths (0: none, `gpu` whole devices; else `gpu` is 1,
    # the device the fraction goes on), and the GPU memory it asks for (bytes, 0: unsaid).
    gpu_share = models.PositiveSmallIntegerField(default=0)
    gpu_memory = models.BigIntegerField(default=0, help_text="bytes")
    # A MIG instance of this profile ("1g.10gb"; "": none): `gpu` is then 0 and `gpu_share`
    # what the instance counts as (its compute slices of seven, docs/gpus.md).
    gpu_mig = models.CharField(max_length=32, blank=True, default="")
    # The sharing mode its GPU share runs under, as its agent said when it started it
    # (sharemodes: mig, mps, timeslice); "": whole GPUs, none, or not started on a node.
    gpu_mode = models.CharField(max_length=16, blank=True, default="", editable=False)
    exit_code = models.IntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    # Set when the server wants the task stopped; resources stay held until the agent confirms.
    kill_requested = models.BooleanField(default=False)
    message = models.TextField(blank=True)
    # Why the attempt ended when its exit code does not say: "OutOfMemory" (the kernel killed
    # it at its memory limit), else "".
    reason = models.CharField(max_length=32, blank=True)
    assigned_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The GPU indices (on `node`) of this attempt, written when it is bound and kept after it
    # ends, when its Allocation rows are gone: a finished job still says which GPUs it used.
    device_indices = models.JSONField(default=list, blank=True)
    # The port its agent chose for the job's app (spec `apps`), on the node's `address`.
    app_port = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # Since when this running attempt's GPUs have been idle (below GPU_IDLE_PERCENT in every
    # lease since), by the server's clock; null while busy or not measured. Written by the
    # lease (scheduler/ops/gpu_idle.py) only when it changes, cleared when an attempt starts.
    gpu_idle_since = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["job_id", "group", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "group", "index"], name="task_unique_per_job"),
            models.CheckConstraint(
                condition=Q(cpu__gte=0) & Q(memory__gte=0), name="task_resources_nonnegative"
            ),
        ]
        indexes = [
            # Heartbeats look up a node's tasks; the snapshot loads tasks on nodes.
            models.Index(fields=["node", "state"], name="task_node_state"),
            # The GPU idle check reads the idle running tasks (few rows).
            models.Index(
                fields=["gpu_idle_since"],
                condition=Q(gpu_idle_since__isnull=False),
                name="task_gpu_idle",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.group}-{self.index}"

    def gpu_holding(self) -> dict[str, str] | None:
        """How this task holds its GPU and what that isolates from other tasks ({"mode",
        "isolation"}: agent/sharemodes.py): the mode its agent said it applied when it started
        it, else (not started yet, or an agent that does not say) by the rule the agent runs
        it under on its node's offer; None with no GPU, or for a share not on a node yet."""
        if self.gpu_mode and (self.gpu_share or self.gpu_mig):
            mode = self.gpu_mode
        elif self.gpu_mig:
            mode = sharemodes.MIG
        elif self.gpu_share and self.node is not None:
            mode = sharemodes.mode_of(self.gpu_share / 1000, "", self.node.gpu_sharing or [])
        elif self.gpu and not self.gpu_share:
            mode = sharemodes.EXCLUSIVE
        else:
            return None
        return sharemodes.describe(mode)

    def gpu_indices(self) -> list[int]:
        """The GPUs this attempt holds (its allocations; prefetch them for many tasks) or, once
        it ended, held. Tasks bound before `device_indices` existed have only allocations."""
        held = sorted(a.device.index for a in self.allocations.all())
        if held or self.node_id is None:
            return held
        return sorted(i for i in self.device_indices or [] if isinstance(i, int))


class Allocation(models.Model):
    """One row while a task holds (part of) a device: `share` thousandths of it, 1000 whole.
    A whole device has one row (a unique index over whole rows); the store checks, under a
    lock on the device rows, that the shares on a device never add up past 1000."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="allocations")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="allocations")
    share = models.PositiveSmallIntegerField(default=1000, db_default=1000)
    # The UUID of the MIG instance of `device` the task holds ("": none); at most one task
    # holds an instance.
    mig = models.CharField(max_length=128, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["device_id", "task_id"]
        constraints = [
            models.UniqueConstraint(fields=["device", "task"], name="allocation_device_task"),
            models.UniqueConstraint(
                fields=["device"], condition=Q(share=1000), name="allocation_whole_device"
            ),
            models.CheckConstraint(
                condition=Q(share__gte=1) & Q(share__lte=1000), name="allocation_share_range"
            ),
            models.UniqueConstraint(
                fields=["device", "mig"], condition=~Q(mig=""), name="allocation_one_per_instance"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.device} -> task {self.task_id}"


class TaskLog(models.Model):
    """A chunk of a task's output; (task, attempt, offset) makes re-sent chunks harmless."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="logs")
    attempt = models.PositiveIntegerField(default=0)
    offset = models.BigIntegerField()
    data = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task_id", "attempt", "offset"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "attempt", "offset"], name="tasklog_unique_chunk"
            ),
        ]


class EventQuerySet(QuerySet[Any]):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """Every writer of job state changes writes its events here or through `save`: the
        one place where notifications enter the outbox, in the writer's transaction."""
        created = super().bulk_create(objs, *args, **kwargs)
        from scheduler.outbox import enqueue_for_events

        enqueue_for_events(created)
        return created


class Event(models.Model):
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32)  # e.g. JobStateChanged, TaskStarted, NodeNotReady
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, null=True, blank=True, related_name="events"
    )
    flow = models.ForeignKey(
        Flow, on_delete=models.CASCADE, null=True, blank=True, related_name="events"
    )
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="events"
    )

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["job", "-id"], name="event_job"),
            models.Index(fields=["flow", "-id"], name="event_flow"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.reason}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        new = self._state.adding
        super().save(*args, **kwargs)
        if new:
            from scheduler.outbox import enqueue_for_events

            enqueue_for_events([self])

    @classmethod
    def visible_to(cls, user: Any) -> QuerySet[Event]:
        """Events of the user's own jobs and flows, and cluster events (nodes); staff see all."""
        if not user or not user.is_authenticated:
            return cls.objects.none()
        if user.is_staff:
            return cls.objects.all()
        return cls.objects.filter(
            Q(job__owner=user) | Q(flow__owner=user) | (Q(job__isnull=True) & Q(flow__isnull=True))
        )


# --- notifications (docs/notifications.md) -------------------------------------------------


def _webhook_secret() -> str:
    return secrets.token_hex(32)


class NotifyPreference(models.Model):
    """A user's notification defaults: which job events (for jobs that do not say) and where
    to (email to the account's address, a webhook signed with `webhook_secret`)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_preference"
    )
    events = models.CharField(
        max_length=120, blank=True, default="", help_text="comma-separated: begin,end,fail,..."
    )
    email = models.BooleanField(default=True, help_text="send to the account's email address")
    webhook_url = models.URLField(max_length=500, blank=True, default="")
    webhook_secret = models.CharField(max_length=64, default=_webhook_secret)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.events or '-'}"


class Outbox(models.Model):
    """One notification to deliver on one channel, written in the transaction of the state
    change it tells of; `run_notifier` delivers it at least once
    (scheduler/notifications/delivery.py).
    `next_attempt_at` is both the retry time and the claim's lease: a worker that dies while
    sending leaves the row to be claimed again once the lease passes."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    job_ref = models.CharField(max_length=40, help_text="the job's id as users write it")
    kind = models.CharField(max_length=20)  # begin, end, fail, time_limit_N
    channel = models.CharField(max_length=10)  # email, webhook
    target = models.CharField(max_length=500, help_text="email address or webhook URL")
    text = models.TextField()
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    next_attempt_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)  # the last claim to send it
    delivered_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [
            # run_notifier claims the due rows still to deliver, oldest first.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(delivered_at__isnull=True, gave_up_at__isnull=True),
                name="outbox_due",
            ),
            # The per-user throttle counts a user's recent attempts, failed ones too.
            models.Index(fields=["last_attempt_at", "user"], name="outbox_user_recent"),
        ]
        constraints = [
            # A time-limit warning fires once per job and channel (the scan repeats).
            models.UniqueConstraint(
                fields=["job", "kind", "channel"],
                condition=Q(kind__startswith="time_limit_"),
                name="outbox_time_limit_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of job {self.job_ref} by {self.channel}"


# --- operations: API tokens, the scheduler's heartbeat, usage accounting -------------------

API_TOKEN_PREFIX = "berth_"


class ApiToken(models.Model):
    """A user's self-service API token. Only the key's sha256 is stored; `prefix` (the key's
    first characters) lets the user tell tokens apart without revealing them."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "-id"], name="apitoken_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def issue_key(self) -> str:
        """Make a new key; only its hash and prefix are kept. Returns the key (shown once)."""
        key = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.key_hash = hash_token(key)
        self.prefix = key[: len(API_TOKEN_PREFIX) + 6]
        return key


class SchedulerHeartbeat(models.Model):
    """One row (pk=1) the leading scheduler rewrites after every cycle: when it last ran, and
    its per-phase timings as histogram buckets. Every web worker reads it for /healthz and
    /metrics, wherever the scheduler runs."""

    leader = models.CharField(max_length=255, blank=True, help_text="host:pid of the writer")
    interval_seconds = models.FloatField(default=1.0)
    last_cycle_at = models.DateTimeField()
    last_cycle_seconds = models.FloatField(default=0.0)
    cycles = models.BigIntegerField(default=0)
    # {phase: {"buckets": [count per upper bound, not cumulative], "sum": s, "count": n}}
    phase_histograms = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"last cycle {self.last_cycle_at} by {self.leader}"


class UserShare(models.Model):
    """A user's fair-share shares (Slurm's `Shares` of an association); a user without a row
    has `BERTH_FAIRSHARE_DEFAULT_SHARE`. `account` is the group the shares are within, "" for
    the cluster: accounts (Slurm's Fair Tree levels) may come later without a new table."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    account = models.CharField(max_length=63, blank=True, default="")
    shares = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e9)],
        help_text="relative shares; 0 puts the user behind everyone with usage",
    )

    class Meta:
        ordering = ["account", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "account"], name="usershare_once"),
            models.CheckConstraint(
                condition=Q(shares__gte=0) & Q(shares__lte=1e9), name="usershare_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}/{self.account or '-'}: {self.shares:g}"


class UsageRecord(models.Model):
    """What one task attempt used, written in the transaction that ends it. It names its job
    and task by id, not foreign key, so accounting outlives TTL deletion of the job."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )  # fmt: skip
    username = models.CharField(max_length=150)  # kept if the account is deleted
    queue = models.CharField(max_length=63)
    job_id = models.BigIntegerField()
    task_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=TaskState.choices)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    day = models.DateField(help_text="UTC day the attempt ended; its whole usage counts there")
    wall_seconds = models.FloatField()
    cpu_seconds = models.FloatField(help_text="cores x seconds")
    gpu_seconds = models.FloatField(help_text="devices x seconds")
    # What the attempt asked for and what its cgroup measured (null where the node did not
    # measure it): efficiency is used / requested, as Slurm's seff shows it.
    memory = models.BigIntegerField(default=0, help_text="bytes requested")
    peak_memory = models.BigIntegerField(null=True, blank=True, help_text="bytes, measured")
    used_cpu_seconds = models.FloatField(null=True, blank=True, help_text="measured")
    gpu_utilization = models.FloatField(null=True, blank=True, help_text="mean %, measured")

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["task_id", "attempt"], name="usage_once_per_attempt"),
        ]
        indexes = [
            # /api/v1/usage/ filters by end time, for everyone (staff) or one user.
            models.Index(fields=["finished_at"], name="usage_finished"),
            models.Index(fields=["user", "finished_at"], name="usage_user_finished"),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id}#{self.attempt} of {self.username}: {self.wall_seconds:.0f}s"


class FinishedJobCount(models.Model):
    """How many jobs ended in each (queue, final state) since the start: the source of the
    berth_jobs_finished_total counter, kept in the database so every process agrees."""

    queue = models.CharField(max_length=63)
    state = models.CharField(max_length=16, choices=JobState.choices)
    count = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["queue", "state"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "state"], name="finishedjobcount_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.state}: {self.count}"


class ShellSession(models.Model):
    """A terminal session in a running task (docs/interactive.md): asked for by a user's
    socket, opened by the task's agent over a socket of its own, closed by either end. `key`
    names it on the agent's socket: random, never guessable from the job."""

    class State(models.TextChoices):
        REQUESTED = "Requested"
        OPEN = "Open"
        CLOSED = "Closed"

    key = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shell_sessions")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")
    attempt = models.IntegerField(default=0)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    client_channel = models.CharField(max_length=200, default="")  # the user's socket's
    command = models.TextField(blank=True, default="")
    rows = models.IntegerField(default=24)
    cols = models.IntegerField(default=80)
    term = models.CharField(max_length=64, default="xterm-256color")
    state = models.CharField(max_length=16, choices=State.choices, default=State.REQUESTED)
    exit_status = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    ordered_at = models.DateTimeField(null=True, blank=True)  # last put in a lease's answer
    opened_at = models.DateTimeField(null=True, blank=True)
    # The latest input (keys, resizes) its agent's socket relayed, written at most every
    # INPUT_MARK_SECONDS (scheduler/agentapi/terminal.py): idle sessions are judged on it.
    last_input_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The leases' question: sessions asked for on this node, not yet opened.
        indexes = [models.Index(fields=["node", "state"], name="shell_node_state")]

    def __str__(self) -> str:
        return f"shell {self.key[:8]} in job {self.job_id}"
