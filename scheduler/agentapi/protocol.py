"""The agent protocol, server side: register, report, lease, log upload (docs/agents.md).

Two streams per agent (protocol 3):
- Reports (`apply_report`) carry every task the agent knows (full state), and the output of
  an ended task inline when it is short. An agent sends them one at a time, so they apply in
  the order the agent saw things. The server validates the whole report before changing
  anything, moves task rows, releases devices of tasks the agent says have stopped, and
  answers with orders (tasks to start and to kill). A repeated report changes nothing more.
- Lease renewals (`renew_lease`, `lease_orders`) keep the node alive and deliver orders; the
  web view holds one open until there are orders for the node (scheduler.notify wakes it).
  A lease changes a task row in one way only: an Assigned task it lists as Running has
  started (so a start costs no report). An old lease body can never undo a newer report.

A task ends on the server only once its output is held: a final report says how many bytes
of output the attempt produced, and until the server holds them the task stays Running and
the answer lists it in `awaiting_output` (the agent ships the rest and reports again).
Job states are derived from task states by the scheduler loop (scheduler/lifecycle/sync.py).
"""

from __future__ import annotations

import logging
import operator
import random
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache, reduce
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from scheduler import gpu_history, gpu_idle, notify
from scheduler.accounting import record_task_ends
from scheduler.agent.client import PROTOCOL
from scheduler.agent.times import parse_unix_time, process_time
from scheduler.arrays import array_env
from scheduler.core.quantity import parse_cpu, parse_memory
from scheduler.events import record
from scheduler.models import Allocation, Device, Event, Node, Task, TaskLog, hash_token
from scheduler.setbased import row_by, update_rows
from scheduler.specs import NAME_RE, NAME_RULE, UNSTORABLE, label_problems
from scheduler.states import OUT_OF_MEMORY, TASK_ON_NODE, TaskState

log = logging.getLogger("berth.agent")
# Lost: the agent stopped the task itself, cut off from the server (agent/partition.py).
REPORTED_STATES = {"Running", "Succeeded", "Failed", "Killed", "Lost"}
FINAL_REPORTS = {"Succeeded": TaskState.SUCCEEDED, "Failed": TaskState.FAILED,
                 "Killed": TaskState.KILLED, "Lost": TaskState.LOST}  # fmt: skip
TRUNCATED = "\n[berth: output truncated: the rest of this attempt's output was dropped]\n"
MAX_OUTPUT_BYTES = 2**62  # a bound for `output_bytes`, far above any real output
INLINE_OUTPUT_BYTES = 16 * 1024  # output a report may carry inline (at most one log chunk)
LEASE_JITTER = 0.25  # a lease is held between 1 and 1.25 leases, so renewals spread out
MAX_PRESSURE = 200  # why a node takes no new task (agent/pressure.py), as its agent says
RENEWAL_WRITE_SECONDS = 1.0  # a node's lease renewed more recently than this is not rewritten
END_REASONS = {"", OUT_OF_MEMORY}  # a task end's `reason` (scheduler/agent/fence.py)
# A task end's `usage`: what its cgroup measured (each may be null: not measured there).
MEASURED = {"peak_memory": int, "cpu_seconds": float, "memory_limit": int,
            "gpu_utilization": float}  # fmt: skip
ENFORCEMENT_TEXT = 500  # characters kept of each string of a registration's `enforcement`


def lease_seconds() -> float:
    """How long a lease request may be held while there is no work: renewals at rest come
    no more often than BERTH_HEARTBEAT_INTERVAL."""
    interval = float(settings.BERTH_HEARTBEAT_INTERVAL)
    return interval * (1.0 + LEASE_JITTER * random.random())


class ProtocolError(Exception):
    """A malformed or forbidden request; `errors` names the fields."""

    def __init__(self, errors: dict[str, list[str]], status: int = 400) -> None:
        super().__init__(str(errors))
        self.errors = errors
        self.status = status


def node_for_token(token: str) -> Node | None:
    return row_by(Node, "token_hash", hash_token(token)) if token else None


def check_protocol(header: str | None, body_version: object = None) -> None:
    """Refuse an agent that does not speak this protocol (426, saying what to do)."""
    if header is not None and header.strip() == str(PROTOCOL):
        return
    got = (header or "").strip()[:20]
    if not got:
        # Protocol 1 agents sent no header; at registration they said "berth-agent/1".
        version = str(body_version or "")
        got = version.rpartition("/")[2][:20] if "/" in version else "none"
    raise ProtocolError(
        {"detail": [f"agent protocol {PROTOCOL} required, got {got}; upgrade the agent"],
         "protocol": [str(PROTOCOL)]},
        status=426,
    )  # fmt: skip


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


def _joining_node(name: str, cpu: int, memory: int) -> tuple[Node, bool]:
    """The node a join token registers (locked), and whether it is new: 409 for a name
    that has a token, which only its own agent or staff may replace."""
    node, created = Node.objects.select_for_update().get_or_create(
        name=name, defaults={"cpu": cpu, "memory": memory}
    )
    if not created and node.token_hash:
        taken = (
            f"node {name!r} is already registered: its own agent re-registers with its"
            " node token; otherwise staff reset its token or delete it first"
        )
        raise ProtocolError({"name": [taken]}, status=409)
    return node, created


def register(data: object, node_token: str | None = None, address: str = "") -> dict[str, Any]:
    """Create or update the node named in `data`, registering from `address` (the agent's
    address as the server saw it, said in the node's event).

    With the join token (`node_token` None) only a new name registers, or one whose token staff
    reset: it gets a new node token. Any other taken name is 409, so that the join token
    never hands over a node (its tasks, other users' start messages). With a node token, the
    agent of that node registers again (a restart) and keeps its token.
    """
    name, cpu, memory, labels, devices = _registration(data)
    assert isinstance(data, dict)
    now = timezone.now()
    with transaction.atomic():
        if node_token is not None:
            node, created = _own_node(node_token, name), False
            token = node_token
        else:
            node, created = _joining_node(name, cpu, memory)
            token = node.issue_token()
        node.cpu, node.memory, node.labels = cpu, memory, labels
        node.enforcement = _enforcement(data.get("enforcement"))
        node.hostname = str(data.get("hostname", ""))[:255]
        node.agent_version = str(data.get("version", ""))[:64]
        node.last_heartbeat = now
        node.state = node.derive_state(alive=True)
        node.save()
        _reconcile_devices(node, devices)
        origin = f" from {address}" if address else ""
        record("NodeRegistered", "Registered" if created else "Reregistered",
               f"{len(devices)} GPUs, cpu {data.get('cpu')}, memory {data.get('memory')}{origin}",
               node=node)  # fmt: skip
        if node.enforcement_problem():
            record("NodeNotReady", "CannotEnforce", node.enforcement_problem(), node=node)
        notify.changed(nodes=[node.pk])
    return {
        "node": node.name,
        "token": token,
        "protocol": PROTOCOL,
        "lease_seconds": settings.BERTH_HEARTBEAT_INTERVAL,
        "heartbeat_timeout": settings.BERTH_HEARTBEAT_TIMEOUT,
        "kill_grace_seconds": settings.BERTH_KILL_GRACE_SECONDS,
        "log_chunk_bytes": settings.BERTH_LOG_CHUNK_BYTES,
        "inline_output_bytes": inline_output_bytes(),
    }


def _registration(data: object) -> tuple[str, int, int, dict[str, str], list[dict[str, Any]]]:
    """A registration's name, cpu, memory, labels and devices, validated whole."""
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.setdefault("name", []).append(f"{name!r} {NAME_RULE}")
    cpu = _need(errors, data, "cpu", _cpu)
    memory = _need(errors, data, "memory", parse_memory)
    labels = data.get("labels") or {}
    errors.update(label_problems(labels))  # the rules REST and the admin apply (Node.clean)
    devices = _devices(errors, data.get("devices"))
    if errors:
        raise ProtocolError(errors)
    assert isinstance(name, str)
    return name, cpu, memory, labels, devices


def _enforcement(raw: object) -> dict[str, Any]:
    """A registration's `enforcement` (what the agent enforces on its tasks), kept as the
    agent said it, bounded: strings, lists of short strings and small integers only."""
    if not isinstance(raw, dict):
        return {}
    kept: dict[str, Any] = {}
    for key in ("mode", "cgroup", "problem"):
        if isinstance(raw.get(key), str):
            kept[key] = storable_text(raw[key])[:ENFORCEMENT_TEXT]
    for key in ("enforced", "missing"):
        if isinstance(raw.get(key), list):
            kept[key] = [storable_text(v)[:32] for v in raw[key][:16] if isinstance(v, str)]
    if isinstance(raw.get("allowed_devices"), list):  # devices.allow rules (--allow-device)
        kept["allowed_devices"] = [storable_text(v)[:32] for v in raw["allowed_devices"][:64]
                                   if isinstance(v, str)]  # fmt: skip
    if _is_int(raw.get("pids_limit")) and 0 <= raw["pids_limit"] < 2**31:
        kept["pids_limit"] = raw["pids_limit"]
    return kept


def _own_node(node_token: str, name: object) -> Node:
    node = (
        Node.objects.select_for_update().filter(token_hash=hash_token(node_token)).first()
        if node_token
        else None
    )
    if node is None:
        unknown = "unknown node token; register with the join token"
        raise ProtocolError({"detail": [unknown]}, status=401)
    if node.name != name:
        message = f"this node token belongs to node {node.name!r}, not {name!r}"
        raise ProtocolError({"name": [message]}, status=403)
    return node


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


# --- reports -----------------------------------------------------------------------------


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_task(item: object, path: str, errors: dict[str, list[str]]) -> Report | None:
    if not isinstance(item, dict):
        errors[path] = ["must be an object"]
        return None
    task_id, attempt, state = item.get("id"), item.get("attempt", 0), item.get("state")
    exit_code, output = item.get("exit_code"), item.get("output_bytes", 0)
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        errors[f"{path}.id"] = ["must be a task id"]
        return None
    if not _is_int(attempt) or attempt < 0:
        errors[f"{path}.attempt"] = ["must be a non-negative integer"]
    if state not in REPORTED_STATES:
        errors[f"{path}.state"] = [f"must be one of {', '.join(sorted(REPORTED_STATES))}"]
    if exit_code is not None and not _is_int(exit_code):
        errors[f"{path}.exit_code"] = ["must be an integer or null"]
    if state == "Failed" and exit_code is None:
        errors[f"{path}.exit_code"] = ["is required for a failed task"]
    if state in FINAL_REPORTS and "output_bytes" not in item:
        errors[f"{path}.output_bytes"] = ["is required when a task has ended"]
    elif not _is_int(output) or not 0 <= output <= MAX_OUTPUT_BYTES:
        errors[f"{path}.output_bytes"] = [f"must be an integer from 0 to {MAX_OUTPUT_BYTES}"]
    stopping = item.get("stopping", False)
    if not isinstance(stopping, bool):
        errors[f"{path}.stopping"] = ["must be true or false"]
    return Report(
        task_id,
        attempt if _is_int(attempt) else 0,
        str(state),
        exit_code if _is_int(exit_code) else None,
        str(item.get("message", ""))[:1000],
        output if _is_int(output) else 0,
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


def inline_output_bytes() -> int:
    """How much output a report may carry inline: the rest goes to `tasks/<id>/log/`."""
    return min(INLINE_OUTPUT_BYTES, settings.BERTH_LOG_CHUNK_BYTES)


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


def _wanted(task: Task | _Row | None, report: Report, node: Node) -> bool:
    """Is this report about the attempt the server wants running on this node?"""
    return (
        task is not None
        and task.node_id == node.pk
        and task.attempt == report.attempt
        and task.state in TASK_ON_NODE
    )


def _kill_order(task_id: int, attempt: int) -> dict[str, Any]:
    return {"id": task_id, "attempt": attempt, "grace_seconds": settings.BERTH_KILL_GRACE_SECONDS}


@dataclass
class _Outcome:
    """What applying a report found: jobs that may have changed, orders for the agent."""

    changed_jobs: set[int] = field(default_factory=set)
    kill: list[dict[str, Any]] = field(default_factory=list)
    awaiting: list[dict[str, Any]] = field(default_factory=list)
    reported: set[int] = field(default_factory=set)  # tasks of this node the report lists
    ended: list[Task] = field(default_factory=list)  # ended in memory, written together
    kept: dict[tuple[int, int], int] = field(default_factory=dict)  # output held, read ahead
    chunks: list[TaskLog] = field(default_factory=list)  # inline output, inserted together
    measured: dict[int, dict[str, Any]] = field(default_factory=dict)  # task id -> its usage


def apply_report(node: Node, data: object) -> dict[str, Any]:
    """Apply one full-state report from `node`'s agent; answer with orders."""
    reports, usage, _ = parse_tasks(data)  # GPU samples are kept from leases only
    now = timezone.now()
    outcome = _Outcome()
    # One live push for the whole report (its output chunks and its task moves), not one each.
    with notify.batch(), transaction.atomic():
        tasks = _lock_reported(node, reports)
        outcome.kept = _kept_many(
            [(r.id, r.attempt) for r in reports if r.id in tasks and r.state in FINAL_REPORTS]
        )
        for report in reports:
            _apply_reported(node, tasks.get(report.id), report, now, outcome)
        start = _reconcile_unreported(node, tasks, now, outcome)
        # ON CONFLICT DO NOTHING: the same chunk from a concurrent retry, without a savepoint.
        TaskLog.objects.bulk_create(outcome.chunks, ignore_conflicts=True)
        _save_ended(outcome.ended, node, outcome.measured)
        was, beat, old_usage = node.state, node.last_heartbeat, node.usage
        _renew(node, now)
        node.usage = usage
        if was != node.state or usage != old_usage or renewal_due(beat, now):
            # Never back in time: a lease may have renewed the node since `now` was read
            # (this row is not locked here), and agents fence against the renewal they sent.
            Node.objects.filter(pk=node.pk).update(
                last_heartbeat=Greatest(Coalesce("last_heartbeat", Value(now)), Value(now)),
                state=node.state,
                usage=node.usage,
            )
        changed_node = bool(outcome.changed_jobs) or was != node.state
        notify.changed(jobs=outcome.changed_jobs, nodes=[node.pk] if changed_node else [])
        # The locked rows hold only what a report reads of their jobs: the starts are read
        # as a lease reads them (START_FIELDS), one query whatever their number.
        start_orders = start_messages(_to_start([t.pk for t in start], node), node)
    return {
        "start": start_orders,
        "kill": outcome.kill,
        "awaiting_output": outcome.awaiting,
        "lease_seconds": settings.BERTH_HEARTBEAT_INTERVAL,
    }


def _lock_reported(node: Node, reports: list[Report]) -> dict[int, Task]:
    """The reported tasks' rows and those of the tasks on this node, locked, in one query.
    The current attempt of a task placed on another node is not this agent's to report (a
    node token acts only for its own node): refused whole. An older attempt is a leftover of
    a task that moved on while this node was away: the agent is told to kill it."""
    tasks = {
        t.pk: t
        for t in Task.objects.select_for_update(of=("self",))
        .select_related("job__owner", "job__queue")  # for the usage records of tasks that end
        .only(*_report_fields())  # of the job, its owner and its queue what those need
        .filter(Q(pk__in=[r.id for r in reports]) | Q(node=node, state__in=TASK_ON_NODE))
        .order_by("pk")
    }
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
    return tasks


@cache
def _report_fields() -> tuple[str, ...]:
    """What a report reads: the whole task; of its job the flow (events), the owner's name
    and the queue's (usage records); not the job's forty other columns and its spec."""
    task = tuple(f.name for f in Task._meta.concrete_fields)
    return (*task, "job__flow", "job__owner__username", "job__queue__name")


def _apply_reported(
    node: Node, task: Task | None, report: Report, now: Any, outcome: _Outcome
) -> None:
    if not _wanted(task, report, node):
        # Unknown, stale or already over on the server: the agent must stop it.
        if report.state == "Running" and not report.stopping:
            outcome.kill.append(_kill_order(report.id, report.attempt))
        return
    assert task is not None
    outcome.reported.add(task.pk)
    if _apply_one(task, report, now, node, outcome):
        outcome.changed_jobs.add(task.job_id)
    if report.state == "Running" and task.kill_requested and not report.stopping:
        outcome.kill.append(_kill_order(task.pk, task.attempt))


def _reconcile_unreported(
    node: Node, tasks: dict[int, Task], now: Any, outcome: _Outcome
) -> list[Task]:
    """Tasks the server placed here that the report does not list: to start, to kill, or
    Lost. A Running task missing from a report is gone from the node: a task becomes Running
    only when the agent lists it (in a report or a lease), and the agent never sends a report
    that leaves out a task it has listed before the server has taken its end."""
    start: list[Task] = []
    for task in tasks.values():  # locked by _lock_reported
        if task.node_id != node.pk or task.state not in TASK_ON_NODE:
            continue
        if task.pk in outcome.reported:
            continue
        if task.state == TaskState.RUNNING:
            _finish(task, TaskState.LOST, None, "agent no longer runs it", now, outcome)
            outcome.changed_jobs.add(task.job_id)
        elif task.kill_requested:
            # Its start may be on its way to the agent in a lease answer: the agent
            # confirms it never ran (or kills it) before its devices are released.
            outcome.kill.append(_kill_order(task.pk, task.attempt))
        else:
            start.append(task)
    return start


def renewal_due(last: Any, now: Any) -> bool:
    """Whether a request must write the node's lease: a renewal less than
    RENEWAL_WRITE_SECONDS old is left as it is (a busy node sends several requests a second;
    node loss is judged over BERTH_HEARTBEAT_TIMEOUT, tens of seconds)."""
    return last is None or (now - last).total_seconds() >= RENEWAL_WRITE_SECONDS


def _renew(node: Node, now: Any) -> None:
    """The agent is alive: renew the lease, and bring a NotReady node back (caller saves)."""
    node.last_heartbeat = now
    was = node.state
    node.state = node.derive_state(alive=True)
    if was != node.state:
        record("NodeReady", "LeaseRenewed", f"{was} -> {node.state}", node=node)


def _apply_one(task: Task, report: Report, now: Any, node: Node, outcome: _Outcome) -> bool:
    """Move one task as its report says; True if its job may have changed."""
    if report.state == "Running":
        return _mark_running(task, now, node, report.started_at)
    kept = outcome.kept.get((task.pk, report.attempt))
    if report.output is not None and report.output[1]:  # inline
        kept = _store_chunk(task, report.attempt, *report.output, contiguous=True, kept=kept,
                            pending=outcome.chunks)  # fmt: skip
    held = _held_bytes(task, report.attempt, report.output_bytes, kept)
    if held < report.output_bytes:
        # The end is known, the output not all here yet: it stays Running until it is.
        outcome.awaiting.append({"id": task.pk, "attempt": task.attempt, "have": held,
                         "want": report.output_bytes})  # fmt: skip
        return _mark_running(task, now, node, report.started_at)
    never_ran = report.state == "Killed" and report.exit_code is None
    if not never_ran and (task.started_at is None or report.started_at is not None):
        task.started_at = process_time(report.started_at, now, task.assigned_at, "start")
    ended = process_time(report.ended_at, now, task.started_at or task.assigned_at, "end")
    _finish(task, FINAL_REPORTS[report.state], report.exit_code, report.message, ended, outcome)
    task.reason = report.reason
    outcome.measured[task.pk] = report.usage
    return True


def _mark_running(task: Task, now: Any, node: Node, started_at: float | None = None) -> bool:
    """Assigned -> Running, started when the agent says the process started (`started_at`,
    Unix seconds, bounded by scheduler/agent/times.py), else `now`."""
    if task.state != TaskState.ASSIGNED:
        return False
    task.state = TaskState.RUNNING
    task.started_at = process_time(started_at, now, task.assigned_at, "start")
    task.save(update_fields=["state", "started_at"])
    record("TaskStarted", "Started", f"{task.group}-{task.index} on {node.name}",
           job=task.job, node=node)  # fmt: skip
    return True


def _held_bytes(task: Task, attempt: int, wanted: int, kept: int | None = None) -> int:
    """Output bytes of the attempt the server holds (all of them once the log cap is hit);
    `kept` when just stored, else read."""
    if wanted == 0:
        return 0
    if kept is None:
        kept = _kept_bytes(task, attempt)
    return wanted if kept >= settings.BERTH_LOG_MAX_BYTES else kept


def _finish(task: Task, state: str, exit_code: int | None, message: str, now: Any,
            outcome: _Outcome) -> None:  # fmt: skip
    """The task stopped: record how (written with the report's other ends, `_save_ended`)."""
    task.state = state
    task.exit_code = exit_code
    task.finished_at = now
    task.message = message
    outcome.ended.append(task)


def _save_ended(ended: list[Task], node: Node,
                measured: dict[int, dict[str, Any]] | None = None) -> None:  # fmt: skip
    """Write the tasks a report ended, free their devices, account for what they used and
    record why, a few statements for all of them."""
    if not ended:
        return
    update_rows(Task, {t.pk: (t.state, t.exit_code, t.started_at, t.finished_at, t.message,
                              t.reason) for t in ended},
                per_row=["state", "exit_code", "started_at", "finished_at", "message",
                         "reason"])  # fmt: skip
    # each task's own finish time is kept
    record_task_ends(ended, timezone.now(), measured=measured or {})
    Allocation.objects.filter(task__in=[t.pk for t in ended]).delete()
    Event.objects.bulk_create(
        Event(kind=f"Task{t.state}", reason=t.state, message=_end_text(t), job_id=t.job_id,
              flow_id=t.job.flow_id, node=node)
        for t in ended
    )  # fmt: skip


def _end_text(task: Task) -> str:
    what = f"{task.group}-{task.index}"
    if task.reason == OUT_OF_MEMORY:
        return f"{what} ran out of memory: {task.message}"
    if task.state == TaskState.FAILED:
        return f"{what} exited with code {task.exit_code}"
    if task.state == TaskState.SUCCEEDED:
        return f"{what} exited with code 0"
    return f"{what}: {task.message}" if task.message else what


# --- lease -------------------------------------------------------------------------------


def renew_lease(token: str, data: object) -> tuple[Node, list[Report], dict[str, Any]]:
    """Authenticate, confirm the starts the body lists, renew the node's lease, keep its GPU
    samples and read its orders (one short transaction; a malformed body is refused whole
    before it)."""
    reports, _, samples = parse_tasks(data)
    recent = {r.id: r.gpu_utilization for r in reports
              if r.gpu_utilization is not None or r.gpu_unmeasured}  # fmt: skip
    token_hash = hash_token(token) if token else ""
    with transaction.atomic():
        now = timezone.now()
        started = _confirm_started(token_hash, reports, now)  # task rows locked first
        node = row_by(Node, "token_hash", token_hash, lock=True)
        if node is None or not token:
            raise ProtocolError({"detail": ["unknown node token; register again"]}, status=401)
        was, beat, sampled = node.state, node.last_heartbeat, node.gpu_sampled_at
        gpu_history.record_samples(node, samples, now)
        _renew(node, now)
        if sampled != node.gpu_sampled_at or was != node.state or renewal_due(beat, now):
            node.save(update_fields=["last_heartbeat", "state", "gpu_sampled_at"])
        Event.objects.bulk_create(
            Event(kind="TaskStarted", reason="Started", job_id=t.job_id, flow_id=t.job.flow_id,
                  node=node, message=f"{t.group}-{t.index} on {node.name}")
            for t in started
        )  # fmt: skip
        changed = bool(started) or was != node.state
        notify.changed(jobs={t.job_id for t in started}, nodes=[node.pk] if changed else [])
    # After the lease's transaction, which locks the node's row after its tasks' rows: task
    # rows are written here only when one goes idle or busy, each statement on its own.
    gpu_idle.observe(node, recent, now)
    return node, reports, lease_orders(node, reports)


def _confirm_started(token_hash: str, reports: list[Report], now: Any) -> list[Task]:
    """Assigned tasks of this node that the body lists as Running: they started. The one
    change a lease makes to a task row (Assigned -> Running, never back), so that an agent
    needs no report of its own to say a task started. Locks those rows first, in the same
    order as a report does (tasks, then the node)."""
    running = {r.id: r for r in reports if r.state == "Running"}
    if not running or not token_hash:
        return []
    candidates = (
        Task.objects.select_for_update(of=("self",))
        .select_related("job")
        .only("attempt", "state", "started_at", "assigned_at", "group", "index", "job__flow")
        .filter(pk__in=running, state=TaskState.ASSIGNED, node__token_hash=token_hash)
    )
    started = [task for task in candidates if task.attempt == running[task.pk].attempt]
    for task in started:
        task.state = TaskState.RUNNING  # when the agent says the process started, bounded
        task.started_at = process_time(running[task.pk].started_at, now, task.assigned_at, "start")
    update_rows(Task, {t.pk: (t.state, t.started_at) for t in started},
                per_row=["state", "started_at"])  # fmt: skip
    return started


# What a start order reads of a task, its job and its owner (_to_start, _start_message).
START_FIELDS = ("attempt", "group", "index", "cpu", "memory", "job", "job__name", "job__spec",
                "job__walltime", "job__array_parent", "job__array_index", "job__owner",
                "job__owner__username")  # fmt: skip
ROW_COLUMNS = ("id", "node_id", "attempt", "state", "kill_requested")  # a _Row's, in order


class _Row(NamedTuple):
    """What deciding a lease's orders reads of a task (no model, no job)."""

    pk: int
    node_id: int | None
    attempt: int
    state: str
    kill_requested: bool


def lease_orders(node: Node, reports: list[Report]) -> dict[str, Any]:
    """Orders for the agent whose tasks are `reports`, read only: tasks placed here it does
    not know yet, and tasks it runs that must stop. The tasks are read as plain rows; only
    those to start are loaded as models, with what a start order says of their jobs."""
    known = {(r.id, r.attempt) for r in reports}
    rows = {row[0]: _Row(*row) for row in _task_rows(node, [r.id for r in reports])}
    kill = []
    for report in reports:
        task = rows.get(report.id)
        if report.state != "Running" or report.stopping:
            continue
        if (
            task is not None
            and task.node_id not in (None, node.pk)
            and (task.attempt == report.attempt)
        ):
            continue  # not this node's to report; its report will be refused
        if not _wanted(task, report, node) or (task is not None and task.kill_requested):
            kill.append(_kill_order(report.id, report.attempt))
    start: list[int] = []
    for task in rows.values():
        if task.node_id != node.pk or task.state != TaskState.ASSIGNED:
            continue
        if (task.pk, task.attempt) in known:
            continue
        if task.kill_requested:
            kill.append(_kill_order(task.pk, task.attempt))
        else:
            start.append(task.pk)
    return {
        "start": start_messages(_to_start(start, node), node),
        "kill": kill,
        "lease_seconds": settings.BERTH_HEARTBEAT_INTERVAL,
    }


def _task_rows(node: Node, reported: list[int]) -> list[tuple[Any, ...]]:
    """`_Row`s of the tasks on `node` and of those `reported`: every lease reads them, so the
    statement is written here rather than built by the ORM each time."""
    quote = connection.ops.quote_name
    on_node = ", ".join(["%s"] * len(TASK_ON_NODE))
    sql = (
        f"SELECT {', '.join(quote(c) for c in ROW_COLUMNS)} FROM {quote(Task._meta.db_table)}"
        f" WHERE ({quote('node_id')} = %s AND {quote('state')} IN ({on_node}))"
    )
    if reported:
        sql += f" OR {quote('id')} IN ({', '.join(['%s'] * len(reported))})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [node.pk, *TASK_ON_NODE, *reported])
        return cursor.fetchall()


def _to_start(ids: list[int], node: Node) -> list[Task]:
    """The tasks of `ids` still Assigned here, with their jobs and owners: what a start
    order says of them (START_FIELDS), not whole rows (a job has some forty columns)."""
    if not ids:
        return []
    tasks = (
        Task.objects.select_related("job__owner")
        .filter(pk__in=ids, node=node, state=TaskState.ASSIGNED, kill_requested=False)
        .only(*START_FIELDS)
    )
    order = {pk: i for i, pk in enumerate(ids)}
    return sorted(tasks, key=lambda t: order[t.pk])


def start_messages(tasks: list[Task], node: Node) -> list[dict[str, Any]]:
    """The start orders of `tasks` (placed on `node`, their jobs and owners loaded), with
    their peers and devices read for all of them at once: three queries whatever their
    number, not three per task."""
    if not tasks:
        return []
    peers: dict[int, list[tuple[int, str, str, str, int]]] = defaultdict(list)
    rows = Task.objects.filter(job_id__in={t.job_id for t in tasks}).values_list(
        "job_id", "pk", "node__hostname", "node__name", "group", "index"
    )
    for job_id, *peer in rows:
        peers[job_id].append(tuple(peer))  # type: ignore[arg-type]
    devices: dict[int, list[int]] = defaultdict(list)
    held = Allocation.objects.filter(task__in=[t.pk for t in tasks])
    for task_id, index in held.values_list("task_id", "device__index"):
        devices[task_id].append(index)
    return [_start_message(t, node, peers[t.job_id], sorted(devices[t.pk])) for t in tasks]


def _start_message(
    task: Task, node: Node, peers: list[tuple[int, str, str, str, int]], devices: list[int]
) -> dict[str, Any]:
    job = task.job
    spec = job.spec
    group: dict[str, Any] = next(
        (g for g in spec.get("tasks", []) if g.get("name") == task.group), {}
    )
    # Ranks follow the spec: its task groups in order, each group's tasks by index.
    position = {g.get("name"): i for i, g in enumerate(spec.get("tasks", []))}
    tasks = sorted(peers, key=lambda t: (position.get(t[3], len(position)), t[3], t[4]))
    rank = next(i for i, t in enumerate(tasks) if t[0] == task.pk)
    master = tasks[0][1] or tasks[0][2] or node.hostname or node.name
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
            **array_env(job),  # BERTH_ARRAY_INDEX etc. for an array's element
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
        # As root, the agent runs the task as the Unix account of this name when it exists.
        "owner": job.owner.username,
        "env": env,
        "devices": devices,
        "walltime": job.walltime,
        # What the agent holds the task to (its cgroup): millicores, bytes, processes.
        "resources": {"cpu": task.cpu, "memory": task.memory, **_pids(group)},
    }


def _pids(group: dict[str, Any]) -> dict[str, int]:
    """The task group's own pids limit, when its spec sets one (else the agent's default)."""
    pids = (group.get("resources") or {}).get("pids")
    if isinstance(pids, int) and not isinstance(pids, bool) and pids > 0:
        return {"pids": pids}
    return {}


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
    with transaction.atomic():
        kept = _store_chunk(task, attempt, offset, text)
    answer: dict[str, Any] = {"next_offset": offset + len(text.encode())}
    if kept >= settings.BERTH_LOG_MAX_BYTES:
        answer["dropped"] = True
    return answer


def _store_chunk(
    task: Task, attempt: int, offset: int, text: str, contiguous: bool = False,
    kept: int | None = None, pending: list[TaskLog] | None = None,
) -> int:  # fmt: skip
    """Keep one chunk of an attempt's output at byte `offset` (a chunk held already, sent
    again, is ignored; past BERTH_LOG_MAX_BYTES the rest is dropped, said once; with
    `contiguous`, a chunk that would leave a gap is not kept). Returns the bytes held now:
    BERTH_LOG_MAX_BYTES once the cap is hit. Inside a transaction. `kept`: the bytes held,
    when read already; `pending`: where to put the chunk for the caller to insert."""
    size = len(text.encode())
    if kept is None:
        kept = _kept_bytes(task, attempt)
    if kept >= settings.BERTH_LOG_MAX_BYTES or offset + size <= kept:
        return kept  # over the cap, or held already (a retried upload)
    if contiguous and offset > kept:
        return kept  # the agent sends the output from what the server says it has
    capped = kept + size > settings.BERTH_LOG_MAX_BYTES
    if capped:  # keep what fits, then say once that the rest is gone
        room = max(settings.BERTH_LOG_MAX_BYTES - kept, 0)
        text = text.encode()[:room].decode(errors="ignore") + TRUNCATED
    chunk = TaskLog(task=task, attempt=attempt, offset=offset, data=text)
    if pending is not None:
        pending.append(chunk)
    else:  # ON CONFLICT DO NOTHING: the same chunk from a concurrent retry, no savepoint
        TaskLog.objects.bulk_create([chunk], ignore_conflicts=True)
    notify.changed(jobs=[task.job_id])
    _published_log(task, attempt, offset, text)
    return settings.BERTH_LOG_MAX_BYTES if capped else max(kept, offset + size)


def storable_text(text: str) -> str:
    """Task output as the database can hold it: NUL (PostgreSQL refuses it in text) and lone
    surrogates (not UTF-8) become U+FFFD, as the agent already does for undecodable bytes."""
    return UNSTORABLE.sub("\ufffd", text)


def _kept_many(attempts: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """`_kept_bytes` of several (task id, attempt) at once: the last chunk of each, in two
    queries (one when none has output yet)."""
    wanted = set(attempts)
    held = dict.fromkeys(wanted, 0)
    if not wanted:
        return held
    last = (
        TaskLog.objects.filter(task_id__in={t for t, _ in wanted})
        .order_by()
        .values_list("task_id", "attempt")
        .annotate(last=Max("offset"))
    )
    where = [Q(task_id=t, attempt=a, offset=o) for t, a, o in last if (t, a) in wanted]
    if not where:
        return held
    rows = TaskLog.objects.filter(reduce(operator.or_, where))
    for task_id, attempt, offset, data in rows.values_list("task_id", "attempt", "offset", "data"):
        held[(task_id, attempt)] = _held_after(offset, data)
    return held


def _kept_bytes(task: Task, attempt: int) -> int:
    last = TaskLog.objects.filter(task=task, attempt=attempt).order_by("-offset").first()
    return 0 if last is None else _held_after(last.offset, last.data)


def _held_after(offset: int, data: str) -> int:
    """The bytes of an attempt's output held, given its last chunk: BERTH_LOG_MAX_BYTES once
    the cap cut it (the chunk ends with TRUNCATED)."""
    if data.endswith(TRUNCATED):
        return settings.BERTH_LOG_MAX_BYTES
    return offset + len(data.encode())


def _published_log(task: Task, attempt: int, offset: int, text: str) -> None:
    notify.log_appended(task.pk, attempt, offset, text)  # after commit, to the listeners
