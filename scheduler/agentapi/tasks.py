"""What an agent says of its tasks in a report or a lease body, validated whole before
anything changes (docs/agents.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from scheduler import gpu_history
from scheduler.agent.client import PROTOCOL as PROTOCOL
from scheduler.agent.times import parse_unix_time
from scheduler.agentapi.common import ProtocolError, is_int
from scheduler.agentapi.logs import inline_output_bytes, storable_text
from scheduler.states import OUT_OF_MEMORY, TaskState

# Lost: the agent stopped the task itself, cut off from the server (agent/partition.py).
REPORTED_STATES = {"Running", "Succeeded", "Failed", "Killed", "Lost"}
FINAL_REPORTS = {"Succeeded": TaskState.SUCCEEDED, "Failed": TaskState.FAILED,
                 "Killed": TaskState.KILLED, "Lost": TaskState.LOST}  # fmt: skip
MAX_OUTPUT_BYTES = 2**62  # a bound for `output_bytes`, far above any real output
MAX_PRESSURE = 200  # why a node takes no new task (agent/pressure.py), as its agent says
END_REASONS = {"", OUT_OF_MEMORY}  # a task end's `reason` (scheduler/agent/fence.py)
# A task end's `usage`: what its cgroup measured (each may be null: not measured there).
MEASURED = {"peak_memory": int, "cpu_seconds": float, "memory_limit": int,
            "gpu_utilization": float}  # fmt: skip


@dataclass
class Report:
    id: int
    attempt: int
    state: str
    exit_code: int | None
    message: str
    output_bytes: int = 0  # of this attempt, in a final report
    stopping: bool = False  # the agent is already stopping it (no new kill order)
    started_at: float | None = None  # the process's start and end, by the agent's clock
    ended_at: float | None = None
    output: tuple[int, str] | None = None  # output sent inline: (byte offset, text)
    reason: str = ""  # why it ended when the exit code does not say (END_REASONS)
    usage: dict[str, Any] = field(default_factory=dict)  # what its cgroup measured (MEASURED)
    # A running task's GPUs' mean utilisation (%) in the sample a lease carries (gpu_idle.py);
    # `gpu_unmeasured`: sent as null, its GPUs could not be read (an idle mark is not kept).
    gpu_utilization: float | None = None
    gpu_unmeasured: bool = False


def _parse_task(item: object, path: str, errors: dict[str, list[str]]) -> Report | None:
    if not isinstance(item, dict):
        errors[path] = ["must be an object"]
        return None
    task_id, attempt, state = item.get("id"), item.get("attempt", 0), item.get("state")
    exit_code, output = item.get("exit_code"), item.get("output_bytes", 0)
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        errors[f"{path}.id"] = ["must be a task id"]
        return None
    if not is_int(attempt) or attempt < 0:
        errors[f"{path}.attempt"] = ["must be a non-negative integer"]
    if state not in REPORTED_STATES:
        errors[f"{path}.state"] = [f"must be one of {', '.join(sorted(REPORTED_STATES))}"]
    if exit_code is not None and not is_int(exit_code):
        errors[f"{path}.exit_code"] = ["must be an integer or null"]
    if state == "Failed" and exit_code is None:
        errors[f"{path}.exit_code"] = ["is required for a failed task"]
    if state in FINAL_REPORTS and "output_bytes" not in item:
        errors[f"{path}.output_bytes"] = ["is required when a task has ended"]
    elif not is_int(output) or not 0 <= output <= MAX_OUTPUT_BYTES:
        errors[f"{path}.output_bytes"] = [f"must be an integer from 0 to {MAX_OUTPUT_BYTES}"]
    stopping = item.get("stopping", False)
    if not isinstance(stopping, bool):
        errors[f"{path}.stopping"] = ["must be true or false"]
    return Report(
        task_id,
        attempt if is_int(attempt) else 0,
        str(state),
        exit_code if is_int(exit_code) else None,
        str(item.get("message", ""))[:1000],
        output if is_int(output) else 0,
        stopping is True,
        parse_unix_time(item, "started_at", path, errors),
        parse_unix_time(item, "ended_at", path, errors),
        _parse_inline(item.get("output"), f"{path}.output", errors),
        _end_reason(item.get("reason", ""), path, errors),
        _measured(item.get("usage"), f"{path}.usage", errors),
        _recent_gpu(item.get("gpu_utilization"), state, f"{path}.gpu_utilization", errors),
        "gpu_utilization" in item and item["gpu_utilization"] is None and state == "Running",
    )  # fmt: skip


def _recent_gpu(
    raw: object, state: object, path: str, errors: dict[str, list[str]]
) -> float | None:
    """A running task's `gpu_utilization`: a percentage from 0 to 100, or absent/null."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 100:
        errors[path] = ["must be a percentage from 0 to 100, or null"]  # NaN fails too
        return None
    if state != "Running":
        errors[path] = ["is only for a running task (an ended one sends usage.gpu_utilization)"]
        return None
    return float(raw)


def _end_reason(raw: object, path: str, errors: dict[str, list[str]]) -> str:
    if raw not in END_REASONS:
        errors[f"{path}.reason"] = [f"must be one of {sorted(END_REASONS)}"]
        return ""
    return str(raw)


def _measured(raw: object, path: str, errors: dict[str, list[str]]) -> dict[str, Any]:
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
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (0 <= value < 2**62)
        ):
            errors[f"{path}.{key}"] = ["must be a non-negative number or null"]
            continue
        usage[key] = kind(value)
    return usage


def _parse_inline(raw: object, path: str, errors: dict[str, list[str]]) -> tuple[int, str] | None:
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
    text = storable_text(text)
    if len(text.encode()) > inline_output_bytes():
        limit = inline_output_bytes()
        errors[f"{path}.data"] = [f"at most {limit} bytes inline; send more with tasks/<id>/log/"]
    return None if offset is None else (offset, text)


def parse_tasks(data: object) -> tuple[list[Report], dict[str, Any], list[gpu_history.GpuSample]]:
    """The `tasks`, `usage` and GPU samples (`usage.gpus`) of a report or lease body,
    validated whole."""
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    raw = data.get("tasks", [])
    usage = data.get("usage") or {}
    errors: dict[str, list[str]] = {}
    if not isinstance(raw, list):
        raise ProtocolError({"tasks": ["must be a list"]})
    if len(raw) > settings.BERTH_AGENT_MAX_TASKS:
        raise ProtocolError({"tasks": [f"at most {settings.BERTH_AGENT_MAX_TASKS} tasks"]})
    if not isinstance(usage, dict):
        errors["usage"] = ["must be an object"]
        usage = {}
    pressure = usage.get("pressure")
    if pressure is not None and not (
        isinstance(pressure, str) and 0 < len(pressure) <= MAX_PRESSURE and pressure.isprintable()
    ):
        errors["usage.pressure"] = [
            f"must be printable text of 1 to {MAX_PRESSURE} characters, or absent"
        ]
    samples = gpu_history.parse_samples(usage.get("gpus"), errors)
    reports = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        report = _parse_task(item, f"tasks.{i}", errors)
        if report is None:
            continue
        if report.id in seen:
            errors[f"tasks.{i}.id"] = [f"task {report.id} is reported twice"]
        seen.add(report.id)
        reports.append(report)
    if errors:
        raise ProtocolError(errors)
    return reports, usage, samples
