"""What an agent says of its tasks in a report or a lease body (`wire.TaskReport`, one per
task), validated whole before anything changes (docs/agents.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from scheduler.agent import wire
from scheduler.agent.wire import TaskReport
from scheduler.agentapi.common import ProtocolError
from scheduler.agentapi.logs import inline_output_bytes, storable_text
from scheduler.ops import gpu_history
from scheduler.states.names import TaskState

# What a final report moves a task to, on the server (wire.TaskState is what agents say).
FINAL_REPORTS = {wire.TaskState.SUCCEEDED: TaskState.SUCCEEDED,
                 wire.TaskState.FAILED: TaskState.FAILED, wire.TaskState.KILLED: TaskState.KILLED,
                 wire.TaskState.LOST: TaskState.LOST}  # fmt: skip
MAX_PRESSURE = 200  # why a node takes no new task (agent/pressure.py), as its agent says


def parse_tasks(
    data: object,
) -> tuple[list[TaskReport], dict[str, Any], list[gpu_history.GpuSample]]:
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
        report = TaskReport.parse(item, f"tasks.{i}", errors, inline_output_bytes(), storable_text)
        if report is None:
            continue
        if report.id in seen:
            errors[f"tasks.{i}.id"] = [f"task {report.id} is reported twice"]
        seen.add(report.id)
        reports.append(report)
    if errors:
        raise ProtocolError(errors)
    return reports, usage, samples
