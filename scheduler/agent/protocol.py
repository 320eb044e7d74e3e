"""The agent protocol, server side: register, heartbeat, log upload.

An agent reports every task it knows in each heartbeat (full state). The server validates the
whole report before changing anything, moves task rows, releases devices of tasks the agent
says have stopped, and answers with tasks to start and tasks to kill. A retried report
changes nothing more, so agents may resend freely. Job states are derived from task states by
the scheduler loop (scheduler/lifecycle.py), not here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduler import notify
from scheduler.core.quantity import parse_cpu, parse_memory
from scheduler.events import record
from scheduler.models import Allocation, Device, Node, Task, TaskLog, hash_token
from scheduler.specs import NAME_RE, NAME_RULE
from scheduler.states import TASK_ON_NODE, TaskState

log = logging.getLogger("berth.agent")
REPORTED_STATES = {"Running", "Succeeded", "Failed", "Killed"}
FINAL_REPORTS = {"Succeeded": TaskState.SUCCEEDED, "Failed": TaskState.FAILED,
                 "Killed": TaskState.KILLED}  # fmt: skip
TRUNCATED = "\n[berth: output truncated: the rest of this attempt's output was dropped]\n"


class ProtocolError(Exception):
    """A malformed or forbidden request; `errors` names the fields."""

    def __init__(self, errors: dict[str, list[str]], status: int = 400) -> None:
        super().__init__(str(errors))
        self.errors = errors
        self.status = status


def node_for_token(token: str) -> Node | None:
    return Node.objects.filter(token_hash=hash_token(token)).first() if token else None


# --- register ----------------------------------------------------------------------------


def _need(errors: dict[str, list[str]], data: dict[str, Any], key: str, parse: Any) -> Any:
    if key not in data:
        errors.setdefault(key, []).append("is required")
        return None
    try:
        return parse(data[key])
    except (ValueError, TypeError) as exc:
        errors.setdefault(key, []).append(str(exc))
        return None


def _cpu(value: object) -> int:
    """An integer is millicores (what an agent measures); a string is cpu as users write it
    ("8" cores, "500m")."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError('must be millicores as an integer, or cores as a string like "8"')
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return value
    return parse_cpu(value)


def _devices(errors: dict[str, list[str]], raw: object) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.setdefault("devices", []).append("must be a list")
        return []
    out = []
    seen = set()
    for i, item in enumerate(raw):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("index"), int)
            or isinstance(item.get("index"), bool)
            or item["index"] < 0
        ):
            errors.setdefault(f"devices.{i}", []).append("needs a non-negative integer index")
            continue
        if item["index"] in seen:
            errors.setdefault(f"devices.{i}.index", []).append("repeats another device's index")
        seen.add(item["index"])
        memory = item.get("memory") or 0
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            errors.setdefault(f"devices.{i}.memory", []).append("must be bytes (an integer)")
            memory = 0
        healthy = item.get("healthy", True)
        if not isinstance(healthy, bool):
            errors.setdefault(f"devices.{i}.healthy", []).append("must be true or false")
        out.append(
            {
                "index": item["index"],
                "uuid": str(item.get("uuid") or "")[:128],
                "model": str(item.get("model") or "")[:128],
                "memory": memory,
                "healthy": healthy is not False,
            }
        )
    return out


def register(data: object) -> dict[str, Any]:
    """Create or update the node named in `data`; issue it a new token."""
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.setdefault("name", []).append(f"{name!r} {NAME_RULE}")
    cpu = _need(errors, data, "cpu", _cpu)
    memory = _need(errors, data, "memory", parse_memory)
    labels = data.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        errors.setdefault("labels", []).append("must be a mapping of strings to strings")
    devices = _devices(errors, data.get("devices"))
    if errors:
        raise ProtocolError(errors)
    now = timezone.now()
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            name=name, defaults={"cpu": cpu, "memory": memory}
        )
        node.cpu, node.memory, node.labels = cpu, memory, labels
        node.hostname = str(data.get("hostname", ""))[:255]
        node.agent_version = str(data.get("version", ""))[:64]
        node.last_heartbeat = now
        node.state = node.derive_state(alive=True)
        token = node.issue_token()
        node.save()
        _reconcile_devices(node, devices)
        record("NodeRegistered", "Registered" if created else "Reregistered",
               f"{len(devices)} GPUs, cpu {data.get('cpu')}, memory {data.get('memory')}",
               node=node)  # fmt: skip
        notify.changed(nodes=[node.pk])
    return {
        "node": node.name,
        "token": token,
        "heartbeat_interval": settings.BERTH_HEARTBEAT_INTERVAL,
        "kill_grace_seconds": settings.BERTH_KILL_GRACE_SECONDS,
        "log_chunk_bytes": settings.BERTH_LOG_CHUNK_BYTES,
    }


def _reconcile_devices(node: Node, devices: list[dict[str, Any]]) -> None:
    present = {d["index"]: d for d in devices}
    for device in Device.objects.filter(node=node):
        info = present.pop(device.index, None)
        if info is None:
            # Gone from the machine: keep a held device (unhealthy) until its task stops.
            if Allocation.objects.filter(device=device).exists():
                device.healthy = False
                device.save(update_fields=["healthy"])
            else:
                device.delete()
            continue
        for key in ("uuid", "model", "memory", "healthy"):
            setattr(device, key, info[key])
        device.save()
    Device.objects.bulk_create(Device(node=node, **info) for info in present.values())


# --- heartbeat ---------------------------------------------------------------------------


@dataclass
class Report:
    id: int
    attempt: int
    state: str
    exit_code: int | None
    message: str


def _parse_report(data: object) -> tuple[list[Report], dict[str, Any]]:
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    raw = data.get("tasks", [])
    usage = data.get("usage") or {}
    errors: dict[str, list[str]] = {}
    if not isinstance(raw, list):
        raise ProtocolError({"tasks": ["must be a list"]})
    if not isinstance(usage, dict):
        errors["usage"] = ["must be an object"]
    reports = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        path = f"tasks.{i}"
        if not isinstance(item, dict):
            errors[path] = ["must be an object"]
            continue
        task_id, attempt, state = item.get("id"), item.get("attempt", 0), item.get("state")
        exit_code = item.get("exit_code")
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            errors[f"{path}.id"] = ["must be a task id"]
            continue
        if task_id in seen:
            errors[f"{path}.id"] = [f"task {task_id} is reported twice"]
        seen.add(task_id)
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
            errors[f"{path}.attempt"] = ["must be a non-negative integer"]
        if state not in REPORTED_STATES:
            errors[f"{path}.state"] = [f"must be one of {', '.join(sorted(REPORTED_STATES))}"]
        if exit_code is not None and (
            not isinstance(exit_code, int) or isinstance(exit_code, bool)
        ):
            errors[f"{path}.exit_code"] = ["must be an integer or null"]
        if state == "Failed" and exit_code is None:
            errors[f"{path}.exit_code"] = ["is required for a failed task"]
        reports.append(
            Report(
                task_id,
                attempt if isinstance(attempt, int) else 0,
                str(state),
                exit_code,
                str(item.get("message", ""))[:1000],
            )  # fmt: skip
        )
    if errors:
        raise ProtocolError(errors)
    return reports, usage


def apply_heartbeat(node: Node, data: object) -> dict[str, Any]:
    """Apply one full-state report from `node`'s agent; answer with tasks to start/kill."""
    reports, usage = _parse_report(data)
    now = timezone.now()
    changed_jobs: set[int] = set()
    kill: list[dict[str, Any]] = []
    grace = settings.BERTH_KILL_GRACE_SECONDS
    with transaction.atomic():
        tasks = {
            t.pk: t
            for t in Task.objects.select_for_update(of=("self",))
            .select_related("job")
            .filter(pk__in=[r.id for r in reports])
        }
        # The current attempt of a task placed on another node is not this agent's to report
        # (a node token acts only for its own node). An older attempt is a leftover of a task
        # that moved on while this node was away: the agent is told to kill it, below.
        foreign = [
            r.id
            for r in reports
            if r.id in tasks
            and tasks[r.id].node_id not in (None, node.pk)
            and tasks[r.id].attempt == r.attempt
        ]
        if foreign:
            raise ProtocolError(
                {"tasks": [f"task {i} is not assigned to node {node.name}" for i in foreign]}
            )
        reported = set()
        for report in reports:
            task = tasks.get(report.id)
            wanted = (
                task is not None
                and task.node_id == node.pk
                and task.attempt == report.attempt
                and task.state in TASK_ON_NODE
            )
            if not wanted:
                # Unknown, stale or already over on the server: the agent must stop it.
                if report.state == "Running":
                    kill.append(
                        {"id": report.id, "attempt": report.attempt, "grace_seconds": grace}
                    )
                continue
            assert task is not None
            reported.add(task.pk)
            if _apply_one(task, report, now, node):
                changed_jobs.add(task.job_id)
            if report.state == "Running" and task.kill_requested:
                kill.append({"id": task.pk, "attempt": task.attempt, "grace_seconds": grace})

        # Tasks the server placed here that the agent did not report.
        start = []
        on_node = Task.objects.select_for_update(of=("self",)).select_related("job")
        for task in on_node.filter(node=node, state__in=TASK_ON_NODE):
            if task.pk in reported:
                continue
            if task.state == TaskState.RUNNING:
                _finish(task, TaskState.LOST, None, "agent no longer runs it", now, node)
                changed_jobs.add(task.job_id)
            elif task.kill_requested:
                _finish(task, TaskState.KILLED, None, "stopped before it started", now, node)
                changed_jobs.add(task.job_id)
            else:
                start.append(task)

        node.last_heartbeat = now
        was = node.state
        node.state = node.derive_state(alive=True)
        node.usage = usage
        node.save(update_fields=["last_heartbeat", "state", "usage"])
        if was != node.state:
            record("NodeReady", "HeartbeatResumed", f"{was} -> {node.state}", node=node)
        notify.changed(
            jobs=changed_jobs, nodes=[node.pk] if changed_jobs or was != node.state else []
        )
        start_messages = [_start_message(task, node) for task in start]
    return {
        "start": start_messages,
        "kill": kill,
        "heartbeat_interval": settings.BERTH_HEARTBEAT_INTERVAL,
    }


def _apply_one(task: Task, report: Report, now: Any, node: Node) -> bool:
    if report.state == "Running":
        if task.state == TaskState.ASSIGNED:
            task.state = TaskState.RUNNING
            task.started_at = now
            task.save(update_fields=["state", "started_at"])
            record("TaskStarted", "Started", f"{task.group}-{task.index} on {node.name}",
                   job=task.job, node=node)  # fmt: skip
            return True
        return False
    if task.started_at is None:  # it ran and ended between two heartbeats
        task.started_at = now
    _finish(task, FINAL_REPORTS[report.state], report.exit_code, report.message, now, node)
    return True


def _finish(task: Task, state: str, exit_code: int | None, message: str, now: Any,
            node: Node) -> None:  # fmt: skip
    """The task stopped: record how, and free its devices."""
    task.state = state
    task.exit_code = exit_code
    task.finished_at = now
    task.message = message
    task.save(update_fields=["state", "exit_code", "started_at", "finished_at", "message"])
    Allocation.objects.filter(task=task).delete()
    what = f"{task.group}-{task.index}"
    if state == TaskState.FAILED:
        text = f"{what} exited with code {exit_code}"
    elif state == TaskState.SUCCEEDED:
        text = f"{what} exited with code 0"
    else:
        text = f"{what}: {message}" if message else what
    record(f"Task{state}", state, text, job=task.job, node=node)


def _start_message(task: Task, node: Node) -> dict[str, Any]:
    job = task.job
    spec = job.spec
    group: dict[str, Any] = next(
        (g for g in spec.get("tasks", []) if g.get("name") == task.group), {}
    )
    # Ranks follow the spec: its task groups in order, each group's tasks by index.
    position = {g.get("name"): i for i, g in enumerate(spec.get("tasks", []))}
    tasks = sorted(
        job.tasks.values_list("pk", "node__hostname", "node__name", "group", "index"),
        key=lambda t: (position.get(t[3], len(position)), t[3], t[4]),
    )
    rank = next(i for i, t in enumerate(tasks) if t[0] == task.pk)
    master = tasks[0][1] or tasks[0][2] or node.hostname or node.name
    devices = sorted(task.allocations.values_list("device__index", flat=True))
    env = dict(group.get("env", {}))
    env.update(
        {
            "BERTH_JOB_ID": str(job.pk),
            "BERTH_JOB_NAME": job.name,
            "BERTH_TASK_GROUP": task.group,
            "BERTH_TASK_INDEX": str(rank),
            "BERTH_ATTEMPT": str(task.attempt),
            "RANK": str(rank),
            "WORLD_SIZE": str(len(tasks)),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(20000 + job.pk % 20000),
            "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices),
        }
    )
    return {
        "id": task.pk,
        "attempt": task.attempt,
        "job_id": job.pk,
        "job_name": job.name,
        "group": task.group,
        "index": task.index,
        "command": group.get("command", ""),
        "env": env,
        "devices": devices,
        "walltime": job.walltime,
    }


# --- logs --------------------------------------------------------------------------------


def append_log(node: Node, task_id: int, data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    attempt, offset, text = data.get("attempt"), data.get("offset"), data.get("data")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 <= attempt < 2**31:
        errors["attempt"] = ["must be a non-negative integer"]
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**62:
        errors["offset"] = ["must be a non-negative integer"]
    if not isinstance(text, str):
        errors["data"] = ["must be a string"]
    else:
        text = storable_text(text)
        if len(text.encode()) > settings.BERTH_LOG_CHUNK_BYTES:
            errors["data"] = [f"chunk larger than {settings.BERTH_LOG_CHUNK_BYTES} bytes"]
    if errors:
        raise ProtocolError(errors)
    assert isinstance(attempt, int) and isinstance(offset, int) and isinstance(text, str)
    task = Task.objects.filter(pk=task_id, node=node).first()
    if task is None:
        raise ProtocolError({"task": [f"task {task_id} is not on node {node.name}"]}, status=404)
    size = len(text.encode())
    with transaction.atomic():
        kept = _kept_bytes(task, attempt)
        if kept >= settings.BERTH_LOG_MAX_BYTES:
            return {"next_offset": offset + size, "dropped": True}
        if kept + size > settings.BERTH_LOG_MAX_BYTES:
            # Keep what fits, then say once that the rest is gone.
            room = max(settings.BERTH_LOG_MAX_BYTES - kept, 0)
            text = text.encode()[:room].decode(errors="ignore") + TRUNCATED
        try:
            with transaction.atomic():
                TaskLog.objects.create(task=task, attempt=attempt, offset=offset, data=text)
        except IntegrityError:
            return {"next_offset": offset + size}  # the same chunk again (a retried upload)
        notify.changed(jobs=[task.job_id])
        _published_log(task, attempt, offset, text)
    return {"next_offset": offset + size}


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """Task output as the database can hold it: NUL (PostgreSQL refuses it in text) and lone
    surrogates (not UTF-8) become U+FFFD, as the agent already does for undecodable bytes."""
    return _UNSTORABLE.sub("\ufffd", text)


def _kept_bytes(task: Task, attempt: int) -> int:
    last = TaskLog.objects.filter(task=task, attempt=attempt).order_by("-offset").first()
    if last is None:
        return 0
    if last.data.endswith(TRUNCATED):
        return settings.BERTH_LOG_MAX_BYTES
    return last.offset + len(last.data.encode())


def _published_log(task: Task, attempt: int, offset: int, text: str) -> None:
    def send() -> None:
        try:
            from dashboard.live import publish_log
        except ImportError:
            return
        try:
            publish_log(task.pk, attempt, offset, text)
        except Exception:  # a failed push never loses the stored output
            log.exception("live log push failed for task %s", task.pk)

    transaction.on_commit(send)
