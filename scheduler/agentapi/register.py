"""`register/`: a new node joins with the cluster join token; its agent, restarting, comes back
with its node token (docs/agents.md)."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler import notify
from scheduler.agent import wire
from scheduler.agent.wire import is_int
from scheduler.agentapi.common import ProtocolError
from scheduler.agentapi.logs import inline_output_bytes, storable_text
from scheduler.core.quantity import parse_cpu, parse_memory
from scheduler.intake.specs import NAME_RE, NAME_RULE, label_problems
from scheduler.jobs.events import record
from scheduler.lifecycle.moves import move_node
from scheduler.models import Allocation, Device, MigInstance, Node, hash_token, sharing_problems
from scheduler.states.codes import EventKind, Reason

ENFORCEMENT_TEXT = 500  # characters kept of each string of a registration's `enforcement`


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
                "mig": _mig(errors, f"devices.{i}.mig", item.get("mig")),
            }
        )
    return out


MIG_INSTANCES = 64  # at most this many MIG instances per GPU are read (7 exist on an H100)


def _mig(errors: dict[str, list[str]], path: str, raw: object) -> list[dict[str, Any]]:
    """A device's MIG instances ({"profile", "uuid", "memory", "gpu_instance",
    "compute_instance"}: wire.Registration), validated."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MIG_INSTANCES:
        errors.setdefault(path, []).append(f"must be a list of at most {MIG_INSTANCES} instances")
        return []
    out = []
    for k, item in enumerate(raw):
        fine = isinstance(item, dict) and all(
            isinstance(item.get(key), str) and 0 < len(item[key]) <= limit
            for key, limit in (("profile", 32), ("uuid", 128))
        )
        numbers = [item.get(key, 0) if isinstance(item, dict) else None
                   for key in ("memory", "gpu_instance", "compute_instance")]  # fmt: skip
        if not fine or not all(isinstance(n, int) and is_int(n) and 0 <= n < 2**62
                               for n in numbers):  # fmt: skip
            errors.setdefault(f"{path}.{k}", []).append(
                "needs a profile and uuid (text) and whole non-negative memory, gpu_instance"
                " and compute_instance"
            )
            continue
        assert isinstance(item, dict)
        memory, gpu_instance, compute_instance = numbers
        out.append({"profile": item["profile"].strip().lower(), "uuid": item["uuid"],
                    "memory": memory, "gpu_instance": gpu_instance,
                    "compute_instance": compute_instance})  # fmt: skip
    if len({m["uuid"] for m in out}) < len(out):
        errors.setdefault(path, []).append("repeats an instance's uuid")
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
        node.gpu_sharing = sorted(set(data.get("gpu_sharing") or []))
        node.hostname = str(data.get("hostname", ""))[:255]
        node.address = _ip(address)  # where app proxies connect: never what the agent says
        node.agent_version = str(data.get("version", ""))[:64]
        node.last_heartbeat = now
        move_node(node, alive=True)
        node.save()
        _reconcile_devices(node, devices)
        origin = f" from {address}" if address else ""
        record(EventKind.NODE_REGISTERED, Reason.REGISTERED if created else Reason.REREGISTERED,
               f"{len(devices)} GPUs, cpu {data.get('cpu')}, memory {data.get('memory')}{origin}",
               node=node)  # fmt: skip
        if node.enforcement_problem():
            record(
                EventKind.NODE_NOT_READY,
                Reason.CANNOT_ENFORCE,
                node.enforcement_problem(),
                node=node,
            )
        notify.changed(nodes=[node.pk])
    return wire.Registered(
        node.name, token, settings.BERTH_HEARTBEAT_INTERVAL, settings.BERTH_HEARTBEAT_TIMEOUT,
        settings.BERTH_KILL_GRACE_SECONDS, settings.BERTH_LOG_CHUNK_BYTES, inline_output_bytes(),
    ).to_json()  # fmt: skip


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
    if problems := sharing_problems(data.get("gpu_sharing") or []):
        errors["gpu_sharing"] = problems
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
    if is_int(raw.get("pids_limit")) and 0 <= raw["pids_limit"] < 2**31:
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
    present = {d["index"]: {k: v for k, v in d.items() if k != "mig"} for d in devices}
    for device in Device.objects.filter(node=node):
        info = present.pop(device.index, None)
        if info is None:
            # Gone from the machine: keep a held device (unhealthy) until its task stops.
            if Allocation.objects.filter(device=device).exists():  # (a share of it too)
                device.healthy = False
                device.save(update_fields=["healthy"])
            else:
                device.delete()
            continue
        for key in ("uuid", "model", "memory", "healthy"):
            setattr(device, key, info[key])
        device.save()
    Device.objects.bulk_create(Device(node=node, **info) for info in present.values())
    _reconcile_mig(node, {d["index"]: d["mig"] for d in devices})


def _reconcile_mig(node: Node, instances: dict[int, list[dict[str, Any]]]) -> None:
    """The node's MIG instances become what its agent found: new ones added, changed ones
    updated, gone ones deleted (a task holding one keeps its allocation, which names the
    instance's UUID, until it stops; nothing new is placed there)."""
    device_ids = dict(Device.objects.filter(node=node).values_list("index", "pk"))
    wanted = {
        (device_ids[index], m["uuid"]): m
        for index, found in instances.items()
        if index in device_ids
        for m in found
    }
    known = MigInstance.objects.filter(device__node=node)
    for instance in known:
        info = wanted.pop((instance.device_id, instance.uuid), None)
        if info is None:
            instance.delete()
            continue
        for key in ("profile", "memory", "gpu_instance", "compute_instance"):
            setattr(instance, key, info[key])
        instance.save()
    MigInstance.objects.bulk_create(
        MigInstance(device_id=device_id, **info) for (device_id, _), info in wanted.items()
    )


def _ip(address: str) -> str | None:
    """`address` if it is an IP address (the peer's, as the server saw it), else None."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None
