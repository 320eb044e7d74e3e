"""State names shared by models, the store adapter, lifecycle and the API."""

from __future__ import annotations

from django.db import models

from scheduler.states.codes import Reason


class JobState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    TERMINATING = "Terminating"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


JOB_FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
# The reason a job suspended by preemption carries (it resumes by itself; a user's suspend
# waits for a resume).
PREEMPTED = Reason.PREEMPTED
JOB_ACTIVE = (JobState.PENDING, JobState.RUNNING, JobState.TERMINATING, JobState.SUSPENDED)


class TaskState(models.TextChoices):
    PENDING = "Pending"
    ASSIGNED = "Assigned"  # bound to a node and devices, waiting for the agent to start it
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    KILLED = "Killed"
    LOST = "Lost"


TASK_ON_NODE = (TaskState.ASSIGNED, TaskState.RUNNING)
# The reason of a task the kernel killed at its memory limit (the agent reports it), and of
# its job when that ends it or restarts it.
OUT_OF_MEMORY = Reason.OUT_OF_MEMORY


class NodeState(models.TextChoices):
    READY = "Ready"
    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    DRAINING = "Draining"
    DRAINED = "Drained"


class FlowState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


FLOW_FINAL = (FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED)


class StepState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    SKIPPED = "Skipped"


class JobRequest(models.TextChoices):
    """A user's request on a job, recorded at once and carried out by the scheduler loop."""

    NONE = ""
    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"
