"""The agent protocol's messages, defined once (docs/agents.md, protocol 3).

Django-free: the node agent (runtime.py), the simulator (sim.py) and the server's side
(scheduler/agentapi/) all build and read these, so the shape of a message is written here and
nowhere else. Each message is a dataclass; `to_json()` gives the body as it travels,
`from_json()` reads an answer the other side sent. What agents send is checked by the server
with `TaskReport.parse`, which names every bad field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from scheduler.agent.times import parse_unix_time

PROTOCOL = 3  # the agent protocol version this code speaks
GPU_SHARING_MODES = ("mig", "mps", "timeslice")  # a registration's `gpu_sharing`
PROTOCOL_HEADER = "Berth-Agent-Protocol"
MAX_OUTPUT_BYTES = 2**62  # a bound for `output_bytes`, far above any real output
OUT_OF_MEMORY = "OutOfMemory"  # a task end's `reason` when its cgroup ran out of memory
END_REASONS = {"", OUT_OF_MEMORY}  # a task end's `reason` (scheduler/agent/fence.py)
# A task end's `usage`: what its cgroup measured (each may be null: not measured there).
MEASURED = {"peak_memory": int, "cpu_seconds": float, "memory_limit": int,
            "gpu_utilization": float}  # fmt: skip

Errors = dict[str, list[str]]


class TaskState(StrEnum):
    """A task's state as its agent reports it. Lost: the agent stopped the task itself, cut
    off from the server (agent/partition.py)."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    KILLED = "Killed"
    LOST = "Lost"


ENDED = frozenset(TaskState) - {TaskState.RUNNING}


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class InlineOutput(NamedTuple):
    """The rest of an ended task's output, carried in its final report: from byte `offset`."""

    offset: int
    data: str

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "data": self.data}


@dataclass
class TaskReport:
    """One task as its agent knows it, in a report or a lease body."""

    id: int
    attempt: int
    state: TaskState
    exit_code: int | None = None
    message: str = ""
    output_bytes: int = 0  # of this attempt, in a final report
    stopping: bool = False  # the agent is already stopping it (no new kill order)
    started_at: float | None = None  # the process's start and end, by the agent's clock
    ended_at: float | None = None
    output: InlineOutput | None = None  # output sent inline (a report's ended task)
    reason: str = ""  # why it ended when the exit code does not say (END_REASONS)
    usage: dict[str, Any] = field(default_factory=dict)  # what its cgroup measured (MEASURED)
    # A running task's GPUs' mean utilisation (%) in the sample a lease carries (gpu_idle.py);
    # `gpu_unmeasured`: sent as null, its GPUs could not be read (an idle mark is not kept).
    gpu_utilization: float | None = None
    gpu_unmeasured: bool = False
    app_port: int | None = None  # a running task's app port (StartOrder.app), when it has one
    # The GPU sharing mode a running task's share runs under here (sharemodes: mig, mps,
    # timeslice; "": whole GPUs or none), as its agent applied it at the start.
    gpu_mode: str = ""

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": self.id,
            "attempt": self.attempt,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "message": self.message,
            "output_bytes": self.output_bytes,
            "stopping": self.stopping,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }
        if self.state != TaskState.RUNNING and (self.reason or self.usage):
            item.update(reason=self.reason, usage=self.usage)
        if self.output is not None:
            item["output"] = self.output.to_json()
        if self.gpu_utilization is not None or self.gpu_unmeasured:
            item["gpu_utilization"] = self.gpu_utilization
        if self.app_port is not None and self.state == TaskState.RUNNING:
            item["app_port"] = self.app_port
        if self.gpu_mode and self.state == TaskState.RUNNING:
            item["gpu_mode"] = self.gpu_mode
        return item

    @classmethod
    def parse(cls, item: object, path: str, errors: Errors, inline_limit: int,
              clean: Callable[[str], str]) -> TaskReport | None:  # fmt: skip
        """A task of a report or lease body as the server reads it; each bad field is added
        to `errors` under `path` (the result is only meaningful without errors). `clean`
        makes output text storable; `inline_limit`: the bytes of output a report may carry."""
        if not isinstance(item, dict):
            errors[path] = ["must be an object"]
            return None
        task_id, attempt, state = item.get("id"), item.get("attempt", 0), item.get("state")
        exit_code, output = item.get("exit_code"), item.get("output_bytes", 0)
        if not is_int(task_id):
            errors[f"{path}.id"] = ["must be a task id"]
            return None
        assert isinstance(task_id, int)
        if not is_int(attempt) or attempt < 0:
            errors[f"{path}.attempt"] = ["must be a non-negative integer"]
        if state not in set(TaskState):
            errors[f"{path}.state"] = [f"must be one of {', '.join(sorted(TaskState))}"]
        if exit_code is not None and not is_int(exit_code):
            errors[f"{path}.exit_code"] = ["must be an integer or null"]
        if state == TaskState.FAILED and exit_code is None:
            errors[f"{path}.exit_code"] = ["is required for a failed task"]
        if state in ENDED and "output_bytes" not in item:
            errors[f"{path}.output_bytes"] = ["is required when a task has ended"]
        elif not is_int(output) or not 0 <= output <= MAX_OUTPUT_BYTES:
            errors[f"{path}.output_bytes"] = [f"must be an integer from 0 to {MAX_OUTPUT_BYTES}"]
        stopping = item.get("stopping", False)
        if not isinstance(stopping, bool):
            errors[f"{path}.stopping"] = ["must be true or false"]
        return cls(
            task_id,
            attempt if is_int(attempt) else 0,
            TaskState(state) if state in set(TaskState) else TaskState.RUNNING,
            exit_code if is_int(exit_code) else None,
            str(item.get("message", ""))[:1000],
            output if is_int(output) else 0,
            stopping is True,
            parse_unix_time(item, "started_at", path, errors),
            parse_unix_time(item, "ended_at", path, errors),
            _inline(item.get("output"), f"{path}.output", errors, inline_limit, clean),
            _end_reason(item.get("reason", ""), path, errors),
            _measured(item.get("usage"), f"{path}.usage", errors),
            _recent_gpu(item.get("gpu_utilization"), state, f"{path}.gpu_utilization", errors),
            "gpu_utilization" in item and item["gpu_utilization"] is None
            and state == TaskState.RUNNING,
            _app_port(item.get("app_port"), f"{path}.app_port", errors),
            _gpu_mode(item.get("gpu_mode", ""), f"{path}.gpu_mode", errors),
        )  # fmt: skip


def _gpu_mode(raw: object, path: str, errors: Errors) -> str:
    """A running task's `gpu_mode`: one of the sharing modes, or absent/empty."""
    if raw in ("", None):
        return ""
    if raw not in GPU_SHARING_MODES:
        errors[path] = [f"must be one of {', '.join(GPU_SHARING_MODES)}, or empty"]
        return ""
    return str(raw)


def _app_port(raw: object, path: str, errors: Errors) -> int | None:
    """A running task's `app_port`: a TCP port from 1 to 65535, or absent/null."""
    if raw is None:
        return None
    if not is_int(raw) or not 1 <= raw <= 65535:  # type: ignore[operator]
        errors[path] = ["must be a TCP port from 1 to 65535, or null"]
        return None
    return int(raw)  # type: ignore[call-overload]


def _recent_gpu(raw: object, state: object, path: str, errors: Errors) -> float | None:
    """A running task's `gpu_utilization`: a percentage from 0 to 100, or absent/null."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 100:
        errors[path] = ["must be a percentage from 0 to 100, or null"]  # NaN fails too
        return None
    if state != TaskState.RUNNING:
        errors[path] = ["is only for a running task (an ended one sends usage.gpu_utilization)"]
        return None
    return float(raw)


def _end_reason(raw: object, path: str, errors: Errors) -> str:
    if raw not in END_REASONS:
        errors[f"{path}.reason"] = [f"must be one of {sorted(END_REASONS)}"]
        return ""
    return str(raw)


def _measured(raw: object, path: str, errors: Errors) -> dict[str, Any]:
    """A task end's `usage`: non-negative numbers (or null) for the keys of MEASURED."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors[path] = ["must be an object"]
        return {}
    usage: dict[str, Any] = {}
    for key, kind in MEASURED.items():
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**62:
            errors[f"{path}.{key}"] = ["must be a non-negative number or null"]
            continue
        usage[key] = kind(value)
    return usage


def _inline(raw: object, path: str, errors: Errors, limit: int,
            clean: Callable[[str], str]) -> InlineOutput | None:  # fmt: skip
    """A task's `output`: `{"offset": bytes, "data": text}`, the output from that offset on."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errors[path] = ["must be an object with offset and data"]
        return None
    offset, text = raw.get("offset"), raw.get("data")
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**62:
        errors[f"{path}.offset"] = [f"must be an integer from 0 to {MAX_OUTPUT_BYTES - 1}"]
        offset = None
    if not isinstance(text, str):
        errors[f"{path}.data"] = ["must be a string"]
        return None
    text = clean(text)
    if len(text.encode()) > limit:
        errors[f"{path}.data"] = [f"at most {limit} bytes inline; send more with tasks/<id>/log/"]
    return None if offset is None else InlineOutput(offset, text)


@dataclass
class Registration:
    """`register/`: the machine an agent offers (cpu in millicores, written as users write cpu;
    memory in bytes; its GPUs)."""

    name: str
    cpu: int  # millicores
    memory: int
    labels: dict[str, str]
    devices: list[dict[str, Any]]
    hostname: str
    version: str
    enforcement: dict[str, Any] | None = None  # what the agent enforces (fence.describe())
    # The GPU sharing modes this node offers (GPU_SHARING_MODES; agent/gpumodes.py says what
    # each isolates). MIG instances ride in their device's dict: `mig`, a list of
    # {"profile", "uuid", "memory", "gpu_instance", "compute_instance"}.
    gpu_sharing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        body = {
            "name": self.name,
            "cpu": f"{self.cpu}m",  # the protocol reads cpu as users write it
            "memory": self.memory,
            "labels": self.labels,
            "devices": self.devices,
            "hostname": self.hostname,
            "version": self.version,
        }
        if self.enforcement is not None:
            body["enforcement"] = self.enforcement
        body["gpu_sharing"] = list(self.gpu_sharing)
        return body


@dataclass
class Registered:
    """The answer to `register/`: the node's token and the server's timings and sizes."""

    node: str
    token: str
    lease_seconds: float
    heartbeat_timeout: float
    kill_grace_seconds: float
    log_chunk_bytes: int
    inline_output_bytes: int
    protocol: int = PROTOCOL

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "token": self.token,
            "protocol": self.protocol,
            "lease_seconds": self.lease_seconds,
            "heartbeat_timeout": self.heartbeat_timeout,
            "kill_grace_seconds": self.kill_grace_seconds,
            "log_chunk_bytes": self.log_chunk_bytes,
            "inline_output_bytes": self.inline_output_bytes,
        }

    @classmethod
    def from_json(cls, answer: dict[str, Any], lease: float, grace: float,
                  chunk: int) -> Registered:  # fmt: skip
        """Read an answer; what it leaves out keeps the agent's own value (`lease`,
        `grace`, `chunk`), or none (0)."""
        return cls(
            str(answer.get("node", "")),
            answer["token"],
            float(answer.get("lease_seconds", lease)),
            float(answer.get("heartbeat_timeout", 0) or 0),
            float(answer.get("kill_grace_seconds", grace)),
            int(answer.get("log_chunk_bytes", chunk)),
            int(answer.get("inline_output_bytes", 0)),
            int(answer.get("protocol", PROTOCOL)),
        )


class KillOrder(NamedTuple):
    """Stop this attempt: SIGTERM, then SIGKILL after `grace_seconds`."""

    id: int
    attempt: int
    grace_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "grace_seconds": self.grace_seconds}

    @classmethod
    def from_json(cls, order: dict[str, Any]) -> KillOrder:
        grace = order.get("grace_seconds")
        return cls(int(order["id"]), int(order["attempt"]), None if grace is None else float(grace))


class AwaitingOutput(NamedTuple):
    """In a report's answer: the server holds `have` bytes of the `want` this ended attempt
    produced, and keeps it Running until it holds them all."""

    id: int
    attempt: int
    have: int
    want: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "have": self.have, "want": self.want}

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> AwaitingOutput:
        return cls(int(item["id"]), int(item["attempt"]), int(item.get("have", 0)),
                   int(item.get("want", 0)))  # fmt: skip


@dataclass
class Orders:
    """The answer to a report or a lease: attempts to start (start messages as the server
    builds them, scheduler/agentapi/orders.py), to kill, and (a report's) output awaited."""

    start: list[dict[str, Any]] = field(default_factory=list)
    kill: list[KillOrder] = field(default_factory=list)
    awaiting_output: list[AwaitingOutput] | None = None  # a report's answer only
    lease_seconds: float | None = None
    terminals: list[TerminalOrder] = field(default_factory=list)  # a lease's answer only

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"start": self.start, "kill": [k.to_json() for k in self.kill]}
        if self.awaiting_output is not None:
            answer["awaiting_output"] = [a.to_json() for a in self.awaiting_output]
        answer["lease_seconds"] = self.lease_seconds
        if self.terminals:
            answer["terminals"] = [t.to_json() for t in self.terminals]
        return answer

    @classmethod
    def from_json(cls, answer: dict[str, Any]) -> Orders:
        lease = answer.get("lease_seconds")
        return cls(
            list(answer.get("start") or []),
            [KillOrder.from_json(k) for k in answer.get("kill") or []],
            [AwaitingOutput.from_json(a) for a in answer.get("awaiting_output") or []],
            None if lease is None else float(lease),
            [TerminalOrder.from_json(t) for t in answer.get("terminals") or []],
        )


# Terminal sessions (docs/interactive.md): a lease's answer orders the agent to open one for
# a running task; the agent opens a websocket of its own to TERMINAL_PATH (outbound, with its
# node token) and relays a pseudo-terminal in the task's context. On that socket a binary
# frame is terminal bytes (at most TERMINAL_FRAME_BYTES); a text frame is a JSON control
# message: from the server `resize` {rows, cols}, `ack` {n} (output frames delivered) and
# `hangup` {reason}; from the agent `exit` {status}. The agent keeps at most
# TERMINAL_WINDOW output frames unacknowledged, so a slow reader holds the program back
# (its writes block on the full pseudo-terminal) instead of losing output.
TERMINAL_PATH = "/ws/agent/sessions/{session}/"
TERMINAL_FRAME_BYTES = 16 * 1024
TERMINAL_WINDOW = 64
TERMINAL_COMMAND_BYTES = 64 * 1024
MAX_TERMINAL_SIZE = 1000  # rows or columns


class TerminalOrder(NamedTuple):
    """Open terminal session `session` in this attempt of a task: `command` in a pseudo-terminal
    of `rows` x `cols` ("" runs the account's interactive shell)."""

    session: str
    task: int
    attempt: int
    command: str = ""
    rows: int = 24
    cols: int = 80
    term: str = "xterm-256color"

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> TerminalOrder:
        return cls(
            str(item["session"]), int(item["task"]), int(item["attempt"]),
            str(item.get("command") or "")[:TERMINAL_COMMAND_BYTES],
            terminal_size(item.get("rows"), 24), terminal_size(item.get("cols"), 80),
            str(item.get("term") or "xterm-256color")[:64],
        )  # fmt: skip


def terminal_size(value: object, default: int) -> int:
    """A terminal's rows or columns: a whole number from 1 to MAX_TERMINAL_SIZE, else `default`."""
    if is_int(value) and 1 <= value <= MAX_TERMINAL_SIZE:  # type: ignore[operator]
        return int(value)  # type: ignore[call-overload]
    return default


@dataclass
class LogChunk:
    """`tasks/<id>/log/`: output of an attempt from byte `offset`."""

    attempt: int
    offset: int
    data: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "offset": self.offset, "data": self.data}


@dataclass
class StartOrder:
    """Start this attempt: what it runs, as whom, with which environment, GPUs and limits
    (`resources`: millicores, bytes and, when its spec sets one, a pids limit). `shares`: the
    part of each device of `devices` it holds, in the same order (1.0: the whole device;
    empty: all whole); `gpu_memory`: the GPU memory (bytes) a share may use, if the job set
    it; `mig`: per device of `devices`, the UUID of the MIG instance it holds there ("": the
    device itself or a share of it; empty: none)."""

    id: int
    attempt: int
    job_id: int
    job_name: str
    group: str
    index: int
    command: str
    owner: str  # as root, the agent runs the task as the Unix account of this name if any
    env: dict[str, str]
    devices: list[int]
    walltime: int | None
    resources: dict[str, int]
    shares: list[float] = field(default_factory=list)
    gpu_memory: int | None = None
    mig: list[str] = field(default_factory=list)
    # The job's app (`http`, `jupyter`) when this task runs it: the agent picks a free port
    # for it, puts it in $BERTH_APP_PORT and reports it (TaskReport.app_port). "": none.
    app: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "attempt": self.attempt,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "group": self.group,
            "index": self.index,
            "command": self.command,
            "owner": self.owner,
            "env": self.env,
            "devices": self.devices,
            "walltime": self.walltime,
            "resources": self.resources,
            "shares": self.shares,
            "gpu_memory": self.gpu_memory,
            "mig": self.mig,
            "app": self.app,
        }

    @classmethod
    def from_json(cls, order: dict[str, Any]) -> StartOrder:
        """An order as an agent reads it: only `id` and `attempt` are required (a test or an
        older server may leave the rest out)."""
        devices = [i for i in order.get("devices") or [] if is_int(i)]
        return cls(
            int(order["id"]), int(order["attempt"]), int(order.get("job_id", 0)),
            str(order.get("job_name", "")), str(order.get("group", "")),
            int(order.get("index", 0)), str(order.get("command", "")),
            str(order.get("owner", "")), dict(order.get("env") or {}), devices,
            order.get("walltime"), dict(order.get("resources") or {}),
            _shares(order.get("shares")), _gpu_memory(order.get("gpu_memory")),
            [str(u) for u in order.get("mig") or [] if isinstance(u, str)],
            str(order.get("app") or ""),
        )  # fmt: skip


def _shares(raw: object) -> list[float]:
    """A start order's `shares`: numbers in (0, 1], one per device ([]: any other value, which
    the agent refuses to start with: agent/gpumodes.py)."""
    if not isinstance(raw, list):
        return []
    good = [s for s in raw if isinstance(s, int | float) and not isinstance(s, bool) and 0 < s <= 1]
    return [float(s) for s in good] if len(good) == len(raw) else []


def _gpu_memory(raw: object) -> int | None:
    return raw if is_int(raw) and isinstance(raw, int) and raw > 0 else None
