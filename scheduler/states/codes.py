"""The codes Berth stores with what happens: the kind of each event (`Event.kind`) and the
reason of each state change (`Job.reason`, `Flow.reason`, `Task.reason`, `Event.reason`).

Both are string enums: a member is stored as its value, so the database, the API and the
pages read the same codes as before, and a writer can only name a code that exists here.
Why a job waits (its pending status code) is the core's `Code` (scheduler/core/status.py).
"""

from __future__ import annotations

import re
from enum import StrEnum


class EventKind(StrEnum):
    JOB_SUBMITTED = "JobSubmitted"
    JOB_RESUBMITTED = "JobResubmitted"
    PRIORITY_LOWERED = "PriorityLowered"  # a template's priority lowered to its owner's cap
    JOB_STATE_CHANGED = "JobStateChanged"
    SCHEDULED = "Scheduled"  # the scheduler placed a job (its reason says how: Bind, Preempt...)
    JOB_INVALID = "JobInvalid"
    JOB_CANCEL_REQUESTED = "JobCancelRequested"
    JOB_SUSPEND_REQUESTED = "JobSuspendRequested"
    JOB_RESUME_REQUESTED = "JobResumeRequested"
    JOB_GPU_IDLE = "JobGpuIdle"
    JOB_GPU_BUSY = "JobGpuBusy"
    # An interactive job holding GPUs idle with no terminal input (scheduler/ops/idle_sessions.py):
    # warned that it will be ended, and the warning withdrawn when it is used again.
    SESSION_IDLE_WARNING = "SessionIdleWarning"
    SESSION_IDLE_CLEARED = "SessionIdleCleared"
    WALLTIME_EXTENDED = "WalltimeExtended"  # its owner gave a running job more time
    TASK_STARTED = "TaskStarted"
    TASK_SUCCEEDED = "TaskSucceeded"
    TASK_FAILED = "TaskFailed"
    TASK_KILLED = "TaskKilled"
    TASK_LOST = "TaskLost"
    NODE_REGISTERED = "NodeRegistered"
    NODE_READY = "NodeReady"
    NODE_NOT_READY = "NodeNotReady"
    NODE_CORDONED = "NodeCordoned"
    NODE_UNCORDONED = "NodeUncordoned"
    NODE_DRAINING = "NodeDraining"
    NODE_DRAINED = "NodeDrained"
    NODE_DELETED = "NodeDeleted"
    NODE_TOKEN_RESET = "NodeTokenReset"
    NODE_INVALID = "NodeInvalid"
    QUEUE_INVALID = "QueueInvalid"
    FLOW_CREATED = "FlowCreated"
    FLOW_RESUBMITTED = "FlowResubmitted"
    FLOW_RETRIED = "FlowRetried"
    FLOW_STATE_CHANGED = "FlowStateChanged"
    FLOW_CANCEL_REQUESTED = "FlowCancelRequested"
    STEP_STATE_CHANGED = "StepStateChanged"
    SHELL_OPENED = "ShellOpened"  # a terminal session in a job (docs/interactive.md)
    SHELL_CLOSED = "ShellClosed"  # its reason: Exited, Idle, Disconnected, Failed, ...

    @classmethod
    def task_ended(cls, state: str) -> EventKind:
        """The event of a task that ended in `state` (TaskSucceeded, TaskFailed, ...)."""
        return cls(f"Task{state}")


class Reason(StrEnum):
    # jobs
    SUBMITTED = "Submitted"
    CREATED = "Created"
    SCHEDULED = "Scheduled"
    STARTED = "Started"
    RESUMED = "Resumed"
    EXTENDED = "Extended"  # a walltime extension (scheduler/jobs/extend.py)
    COMPLETED = "Completed"
    CANCELLED = "Cancelled"
    CANCEL_REQUESTED = "CancelRequested"
    RETRYING = "Retrying"
    PREEMPTED = "Preempted"  # suspended by preemption: it resumes by itself
    USER_SUSPENDED = "UserSuspended"  # suspended by its user: it waits for a resume
    USER_REQUEST = "UserRequest"
    TASK_FAILED = "TaskFailed"
    TASK_LOST = "TaskLost"
    OUT_OF_MEMORY = "OutOfMemory"  # the kernel killed a task at its memory limit
    ELEMENT_FAILED = "ElementFailed"
    INVALID_JOB = "InvalidJob"
    PRIORITY_POLICY = "PriorityPolicy"
    GPUS_IDLE = "GpusIdle"
    GPUS_BUSY = "GpusBusy"
    TERMINAL_INPUT = "TerminalInput"  # an idle session's warning withdrawn: its user typed
    APP_REQUEST = "AppRequest"  # ... or used its web app through the proxy
    GPU_IDLE_TIMEOUT = "GpuIdleTimeout"  # an interactive job ended for holding GPUs idle
    SESSION_ENDED = "SessionEnded"  # an interactive job ended with its last terminal session
    # flows
    INVALID_JOB_SPEC = "InvalidJobSpec"
    FLOW_CANCELLED = "FlowCancelled"
    FLOW_FAIL_FAST = "FlowFailFast"
    STEP_FAILED = "StepFailed"
    # nodes and queues
    OPERATOR = "Operator"
    NODE_DELETED = "NodeDeleted"
    REGISTERED = "Registered"
    REREGISTERED = "Reregistered"
    CANNOT_ENFORCE = "CannotEnforce"
    LEASE_RENEWED = "LeaseRenewed"
    HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
    NODE_NOT_READY = "NodeNotReady"
    DRAINED = "Drained"
    INVALID_CAPABILITY = "InvalidCapability"
    INVALID_LABELS = "InvalidLabels"


def member_name(code: str) -> str:
    """`JobStateChanged` -> `JOB_STATE_CHANGED`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", code).upper()
