"""Validation of job, template and flow specs: every bad field named with its reason.

Pure functions, no database: `normalize_*` returns the spec in canonical form (resources
printed the way users write them) or raises SpecError with every problem found, keyed by the
field's path (`tasks.0.resources.gpu`). Existence of queues and templates is checked where
objects are created (scheduler/jobs/submit.py).
"""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from scheduler.core.duration import DurationError, parse_duration
from scheduler.core.quantity import (
    format_cpu,
    format_gpu,
    format_memory,
    parse_cpu,
    parse_gpu_field,
    parse_memory,
)
from scheduler.intake.arrayspec import ArraySpecError, parse_array

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
NAME_RULE = "must be lowercase letters, digits, '-', '_' or '.', start and end with a letter or digit, at most 63 characters"  # noqa: E501
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

JOB_FIELDS = {
    "name", "queue", "priority", "preemptible", "min_available", "walltime",
    "ttl_seconds_after_finished", "active_deadline_seconds", "max_retry", "labels", "tasks",
    "array", "notify", "apps", "interactive",
}  # fmt: skip
TASK_FIELDS = {"name", "replicas", "command", "env", "resources", "node_selector"}
RESOURCE_FIELDS = {"cpu", "memory", "gpu", "gpu_memory", "pids"}
FLOW_FIELDS = {"name", "parallelism", "fail_fast", "ttl_seconds_after_finished", "steps"}
STEP_FIELDS = {"name", "template", "spec", "depends_on", "overrides", "items"}
# What a flow step may override in its template's (or inline) spec: job and task fields.
OVERRIDE_JOB = {"priority", "queue", "walltime", "max_retry", "preemptible", "min_available",
                "active_deadline_seconds"}  # fmt: skip
OVERRIDE_TASK = {"command", "env", "resources", "node_selector", "replicas"}
# Job fields given in seconds (or a duration: "1h30m", "01:30:00"), with their smallest value.
SECONDS_FIELDS = {"walltime": 1, "ttl_seconds_after_finished": 0, "active_deadline_seconds": 1}
# Whole numbers the database stores as 32-bit integers (counts).
MAX_INT = 2**31 - 1
MAX_ERRORS = 50  # per spec: enough to fix it, never a flood
RESERVED_LABEL_PREFIX = "berth/"
# Far above any machine, low enough for the database's integers.
RESOURCE_MAX = {"cpu": 10**9, "memory": 2**60, "gpu": 1024}  # millicores, bytes, devices
# The node holds a task to its memory (a cgroup): below this not even a shell starts, so such
# a request is refused at submit rather than killed at once. `sleep` runs in 32Mi.
MIN_TASK_MEMORY = 4 * 2**20
MAX_PIDS = 2**22  # the kernel's largest pid_max: a task's pids limit (processes and threads)
# Job events a user may be told of (Slurm's --mail-type BEGIN, END, FAIL, TIME_LIMIT_N).
# time_limit_10m, time_limit_1m: that long before the walltime (interactive jobs' defaults).
NOTIFY_EVENTS = ("begin", "end", "fail", "time_limit_90", "time_limit_80", "time_limit_50",
                 "time_limit_10m", "time_limit_1m")  # fmt: skip
NOTIFY_FIELDS = {"events", "email", "webhook"}
MAX_WEBHOOK_URL = 500
# A job's web app (docs/interactive.md): `http` sees paths without /apps/<job>, `jupyter`
# keeps the prefix (its $BERTH_APP_BASE_URL). One app per job, run by its first task.
APP_KINDS = ("http", "jupyter")
APP_FIELDS = {"kind"}


class SpecError(Exception):
    """A spec with problems; `errors` maps each field path to what is wrong with it."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items()))
        self.errors = errors


class _Errors:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        if len(self.errors) < MAX_ERRORS or path in self.errors:
            self.errors.setdefault(path or "spec", []).append(message)

    def raise_if_any(self) -> None:
        if self.errors:
            raise SpecError(self.errors)


def _path(prefix: str, key: str | int) -> str:
    key = _shorten(str(key), 64)
    return f"{prefix}.{key}" if prefix else key


def limit(name: str) -> int:
    """An input limit from the settings (`BERTH_MAX_<NAME>`, documented in docs/limits.md)."""
    return int(getattr(settings, f"BERTH_MAX_{name}"))


def _shorten(text: str, size: int) -> str:
    return text if len(text) <= size else f"{text[:size]}..."


def _show(value: object) -> str:
    """A value as an error message quotes it: never more than a few dozen characters."""
    return _shorten(repr(value), 40)


UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _too_long(text: str, max_bytes: int) -> str | None:
    """What is wrong with `text` as a stored string: too long, or holding a NUL or a lone
    surrogate (REST refuses those while parsing; the admin and commands come through here)."""
    if UNSTORABLE.search(text):
        return "must not contain NUL characters or lone surrogates"
    size = len(text.encode())
    return f"at most {max_bytes} bytes, got {size}" if size > max_bytes else None


def _int(
    errors: _Errors, data: dict[str, Any], key: str, path: str, *,
    default: int | None, minimum: int | None = None, maximum: int | None = None,
) -> int | None:  # fmt: skip
    value = data.get(key)
    if value is None:  # absent, or null (an empty YAML value): the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(path, f"must be a whole number, got {_show(value)}")
        return default
    if minimum is not None and value < minimum:
        errors.add(path, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        errors.add(path, f"must be at most {maximum}, got {value}")
    return value


def _duration(
    errors: _Errors, data: dict[str, Any], key: str, path: str, *, minimum: int, maximum: int
) -> int | None:
    """Seconds from a whole number or a duration string (scheduler/core/duration.py)."""
    value = data.get(key)
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        errors.add(path, str(exc))
        return None
    if seconds < minimum:
        errors.add(path, f"must be at least {minimum}, got {seconds}")  # as _int says it
    elif seconds > maximum:
        errors.add(path, f"must be at most {maximum}, got {seconds}")
    return seconds


def _bool(errors: _Errors, data: dict[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        errors.add(path, f"must be true or false, got {_show(value)}")
        return default
    return value


def _name(errors: _Errors, value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        errors.add(
            path, "is required" if value in (None, "") else f"must be a string, got {_show(value)}"
        )
        return ""
    if not NAME_RE.match(value):
        errors.add(path, f"{_show(value)} {NAME_RULE}")
    return value


def _str_map(errors: _Errors, value: object, path: str, *, env: bool = False) -> dict[str, str]:
    """Names to values: environment variables (`env`) or labels and node selectors, each
    bounded in count and size."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(path, f"must be a mapping of names to values, got {type(value).__name__}")
        return {}
    most = limit("ENV_VARS") if env else limit("LABELS")
    if len(value) > most:
        errors.add(path, f"at most {most} entries, got {len(value)}")
        return {}
    key_bytes = limit("LABEL_BYTES")
    value_bytes = limit("ENV_VALUE_BYTES") if env else limit("LABEL_BYTES")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            errors.add(path, f"keys must be non-empty strings, got {_show(key)}")
            continue
        if (problem := _too_long(key, key_bytes)) is not None:
            errors.add(_path(path, key), f"name: {problem}")
            continue
        if env and not ENV_RE.match(key):
            errors.add(_path(path, key), "is not a valid environment variable name")
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float):
            errors.add(_path(path, key), f"must be a string or number, got {type(item).__name__}")
            continue
        text = str(item)
        if (problem := _too_long(text, value_bytes)) is not None:
            errors.add(_path(path, key), problem)
            continue
        out[key] = text
    return out


def label_problems(value: object) -> dict[str, list[str]]:
    """What is wrong with labels (a node's, a job's): names to strings, bounded."""
    errors = _Errors()
    labels = _str_map(errors, value, "labels")
    if isinstance(value, dict):
        for key, item in value.items():
            if key in labels and not isinstance(item, str):
                errors.add(_path("labels", key), "must be a string")
    return errors.errors


def _command(errors: _Errors, value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        errors.add(path, "is required: a shell command to run")
        return ""
    if (problem := _too_long(value, limit("COMMAND_BYTES"))) is not None:
        errors.add(path, problem)
    return value


def _unknown(errors: _Errors, data: dict[str, Any], allowed: set[str], path: str) -> None:
    for key in sorted(set(data) - allowed, key=str)[:MAX_ERRORS]:
        errors.add(_path(path, str(key)), f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _resources(errors: _Errors, value: object, path: str, *, fill: bool = True) -> dict[str, Any]:
    """Resources in canonical form. `fill` gives an absent gpu 0; an absent cpu or memory stays
    absent until the job's queue gives its default (`with_queue_defaults`); an override keeps
    every absent one absent."""
    empty: dict[str, Any] = {"gpu": 0} if fill else {}
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.add(path, f"must be a mapping with cpu, memory, gpu, got {type(value).__name__}")
        return empty
    _unknown(errors, value, RESOURCE_FIELDS, path)
    out = dict(empty)
    for key, parse, fmt in (
        ("cpu", parse_cpu, format_cpu),
        ("memory", parse_memory, format_memory),
    ):
        if key not in value:
            continue
        try:
            amount = parse(value[key])
        except ValueError as exc:
            errors.add(_path(path, key), str(exc))
            continue
        if amount > RESOURCE_MAX[key]:
            errors.add(_path(path, key), f"must be at most {fmt(RESOURCE_MAX[key])}")
            continue
        if key == "memory" and amount < MIN_TASK_MEMORY:
            errors.add(_path(path, key), f"must be at least {format_memory(MIN_TASK_MEMORY)}"
                       " (the node holds a task to its memory)")  # fmt: skip
            continue
        out[key] = fmt(amount)
    _gpu(errors, value, path, out)
    if "pids" in value:
        pids = value["pids"]
        if isinstance(pids, bool) or not isinstance(pids, int) or not 1 <= pids <= MAX_PIDS:
            errors.add(_path(path, "pids"), f"must be a whole number from 1 to {MAX_PIDS}")
        else:
            out["pids"] = pids
    return out


def _gpu(errors: _Errors, value: dict[str, Any], path: str, out: dict[str, Any]) -> None:
    """`gpu` (whole devices, a fraction of one: 0.25, or a MIG profile: "1g.10gb") and
    `gpu_memory` (a size, only with a fraction) into `out`."""
    share, profile = None, ""
    if "gpu" in value:
        try:
            devices, share, profile = parse_gpu_field(value["gpu"])
        except ValueError as exc:
            errors.add(_path(path, "gpu"), str(exc))
        else:
            if devices > RESOURCE_MAX["gpu"]:
                errors.add(_path(path, "gpu"), f"must be at most {RESOURCE_MAX['gpu']}")
            else:
                out["gpu"] = profile or format_gpu(devices, share)
    if "gpu_memory" not in value:
        return
    try:
        amount = parse_memory(value["gpu_memory"])
    except ValueError as exc:
        errors.add(_path(path, "gpu_memory"), str(exc).replace("memory", "gpu_memory", 1))
        return
    if amount <= 0 or amount > RESOURCE_MAX["memory"]:
        errors.add(_path(path, "gpu_memory"), "must be more than 0 and at most"
                   f" {format_memory(RESOURCE_MAX['memory'])}")  # fmt: skip
    elif profile:
        errors.add(_path(path, "gpu_memory"), f"a MIG instance ({profile}) comes with its own"
                   " memory: leave gpu_memory out")  # fmt: skip
    elif share == 0:
        errors.add(_path(path, "gpu_memory"), "needs a fraction of a GPU (gpu below 1): a whole"
                   " GPU comes with all of its memory")  # fmt: skip
    else:
        out["gpu_memory"] = format_memory(amount)


def normalize_job_spec(data: object, *, name_required: bool = True) -> dict[str, Any]:
    """A job spec in canonical form, or SpecError naming every bad field."""
    errors = _Errors()
    if not isinstance(data, dict):
        raise SpecError({"spec": [f"must be a mapping, got {type(data).__name__}"]})
    _unknown(errors, data, JOB_FIELDS, "")
    spec = _job_level_fields(errors, data, name_required)
    elements = 0
    if data.get("array") is not None:  # only array jobs carry the key: other specs are unchanged
        spec["array"], elements = _array(errors, data["array"])
    if data.get("notify") is not None:  # as `array`: other specs are unchanged
        spec["notify"] = _notify(errors, data["notify"], "notify")
    if data.get("apps") not in (None, []):  # as `array`: other specs are unchanged
        spec["apps"] = _apps(errors, data["apps"], "apps")
    if data.get("interactive") not in (None, False):  # as `array`: other specs are unchanged
        spec["interactive"] = _interactive(errors, data["interactive"])
    spec["tasks"], total = _task_groups(errors, data.get("tasks"))
    min_available = _int(errors, data, "min_available", "min_available", default=None, minimum=1,
                         maximum=MAX_INT)  # fmt: skip
    if min_available is not None and total and min_available > total:
        errors.add(
            "min_available", f"must be at most the total replicas ({total}), got {min_available}"
        )
    spec["min_available"] = min_available if min_available is not None else max(total, 1)
    max_tasks = array_max_tasks()
    if elements * total > max_tasks:
        errors.add("array", f"{elements} elements of {total} tasks make {elements * total} tasks;"
                            f" at most {max_tasks} per array")  # fmt: skip
    errors.raise_if_any()
    return spec


def _job_level_fields(errors: _Errors, data: dict[str, Any], name_required: bool) -> dict[str, Any]:
    """The job-level fields of a spec (all but tasks, min_available and array)."""
    spec: dict[str, Any] = {}
    if name_required or data.get("name") is not None:
        spec["name"] = _name(errors, data.get("name"), "name")
    queue = data.get("queue", "default")
    spec["queue"] = _name(errors, queue, "queue")
    spec["priority"] = _int(errors, data, "priority", "priority", default=0,
                            minimum=-limit("PRIORITY"), maximum=limit("PRIORITY"))  # fmt: skip
    spec["preemptible"] = _bool(errors, data, "preemptible", "preemptible", True)
    for key, minimum in SECONDS_FIELDS.items():
        spec[key] = _duration(errors, data, key, key, minimum=minimum, maximum=limit("SECONDS"))
    spec["max_retry"] = _int(errors, data, "max_retry", "max_retry", default=0, minimum=0,
                             maximum=100)  # fmt: skip
    spec["labels"] = _str_map(errors, data.get("labels"), "labels")
    for key in spec["labels"]:
        if key.startswith(RESERVED_LABEL_PREFIX):
            errors.add(_path("labels", key), f"the prefix {RESERVED_LABEL_PREFIX!r} is Berth's own")
    return spec


def notify_events(value: object) -> tuple[list[str], str | None]:
    """`begin,end` or ["begin", "end"] (or "none", []) -> the events in canonical order, and
    what is wrong with `value` (None when nothing is)."""
    if isinstance(value, str):
        value = [] if value.strip() in ("", "none") else value.split(",")
    if not isinstance(value, list) or len(value) > 2 * len(NOTIFY_EVENTS):
        return [], f"must be a list of {', '.join(NOTIFY_EVENTS)} (or a comma-separated string)"
    names = [item.strip().lower() if isinstance(item, str) else item for item in value]
    unknown = [_show(n) for n in names if n not in NOTIFY_EVENTS]
    if unknown:
        return [], f"unknown event {unknown[0]}: the events are {', '.join(NOTIFY_EVENTS)}"
    return [e for e in NOTIFY_EVENTS if e in names], None


def webhook_url_problem(url: object) -> str | None:
    """Why `url` may not receive webhooks (None: it may): printable ASCII, http(s), no
    credentials, and a host staff allow in BERTH_WEBHOOK_ALLOWED_HOSTS (`example.com`, or
    `.example.com` for it and its subdomains), on the scheme's own port unless the entry
    names one (`example.com:8443`, or `example.com:*` for any). The host checked is the one
    the HTTP client connects to (parsed by httpx, not only by urlsplit, which drops tabs and
    newlines). Checked where a URL is given and again before each delivery."""
    if not isinstance(url, str) or not url:
        return "must be a URL"
    if len(url) > MAX_WEBHOOK_URL:
        return f"must be at most {MAX_WEBHOOK_URL} characters"
    if not (url.isascii() and url.isprintable()) or " " in url:
        return "must be printable ASCII without spaces (percent-encode the rest)"
    try:
        parts = urlsplit(url)
        parsed = httpx.URL(url)
        host = parsed.host.lower()
        port = parsed.port
    except (ValueError, httpx.InvalidURL):
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not host or parsed.scheme != parts.scheme:
        return "must be an http:// or https:// URL"
    if parts.username is not None or parts.password is not None or parsed.userinfo:
        return "must not hold credentials"
    if host != (parts.hostname or "").lower():
        return "is not a valid URL"
    for entry in (h.lower() for h in settings.BERTH_WEBHOOK_ALLOWED_HOSTS):
        name, _, entry_port = entry.partition(":")
        if not (
            host == name or (name.startswith(".") and (host.endswith(name) or host == name[1:]))
        ):
            continue
        if port is None or entry_port in ("*", str(port)):
            return None
    shown = host if port is None else f"{host}:{port}"
    return f"host {shown!r} is not allowed for webhooks (BERTH_WEBHOOK_ALLOWED_HOSTS)"


def _interactive(errors: _Errors, value: object) -> dict[str, Any]:
    """`interactive`: true, or {persist: bool} (docs/interactive.md): the job ends with its
    last terminal session (when it persists, only when the session's command exited)."""
    if value is True:
        return {"persist": False}
    if not isinstance(value, dict):
        errors.add("interactive", "must be true, false or {persist: true|false}")
        return {"persist": False}
    _unknown(errors, value, {"persist"}, "interactive")
    persist = value.get("persist", False)
    if not isinstance(persist, bool):
        errors.add("interactive.persist", "must be true or false")
        persist = False
    return {"persist": persist}


def _notify(errors: _Errors, value: object, path: str) -> dict[str, Any]:
    """`notify`: a list or string of events, or {events, email, webhook}."""
    data = value if isinstance(value, dict) else {"events": value}
    _unknown(errors, data, NOTIFY_FIELDS, path)
    events, problem = notify_events(data.get("events", []))
    if problem:
        errors.add(_path(path, "events"), problem)
    out: dict[str, Any] = {"events": events}
    if "email" in data:
        out["email"] = _bool(errors, data, "email", _path(path, "email"), True)
    if data.get("webhook") not in (None, ""):
        problem = webhook_url_problem(data["webhook"])
        if problem:
            errors.add(_path(path, "webhook"), problem)
        out["webhook"] = data["webhook"]
    return out


def _apps(errors: _Errors, value: object, path: str) -> list[dict[str, str]]:
    """`apps`: `jupyter`, or [{"kind": "jupyter"}]: at most one app, of a known kind."""
    items = [{"kind": value}] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) != 1:
        errors.add(path, f"must be one app: a kind ({', '.join(APP_KINDS)}) or [{{kind: ...}}]")
        return []
    item = items[0] if isinstance(items[0], dict) else {"kind": items[0]}
    _unknown(errors, item, APP_FIELDS, _path(path, 0))
    kind = item.get("kind")
    if kind not in APP_KINDS:
        errors.add(_path(_path(path, 0), "kind"),
                   f"must be one of {', '.join(APP_KINDS)}, got {_show(kind)}")  # fmt: skip
        return []
    return [{"kind": str(kind)}]


def extend_seconds(data: object) -> int:
    """An extend request's body, `{"by": "30m"}` (a duration or seconds) -> seconds, or
    SpecError naming `by`."""
    if not isinstance(data, dict):
        raise SpecError({"body": ['must be an object: {"by": "30m"}']})
    errors = _Errors()
    _unknown(errors, data, {"by"}, "")
    if data.get("by") is None:
        errors.add("by", "is required: a duration (30m, 1h30m, 01:30:00) or seconds")
    seconds = _duration(errors, data, "by", "by", minimum=1, maximum=limit("SECONDS"))
    errors.raise_if_any()
    assert seconds is not None
    return seconds


def job_app(spec: object) -> str:
    """The kind of app a stored job spec declares, or "" (none, or not a spec)."""
    apps = spec.get("apps") if isinstance(spec, dict) else None
    if isinstance(apps, list) and apps and isinstance(apps[0], dict):
        kind = apps[0].get("kind")
        return kind if kind in APP_KINDS else ""
    return ""


def _task_groups(errors: _Errors, tasks: object) -> tuple[list[dict[str, Any]], int]:
    """The spec's task groups in canonical form, and their total replicas."""
    if not isinstance(tasks, list) or not tasks:
        errors.add("tasks", "must be a non-empty list of task groups")
        return [], 0
    if len(tasks) > limit("TASKS_PER_JOB"):
        errors.add("tasks", f"at most {limit('TASKS_PER_JOB')} task groups, got {len(tasks)}")
        return [], 0
    groups: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = 0
    for i, task in enumerate(tasks):
        path = f"tasks.{i}"
        if not isinstance(task, dict):
            errors.add(path, f"must be a mapping, got {type(task).__name__}")
            continue
        group = _task_group(errors, task, path, "main" if len(tasks) == 1 else None)
        name = group["name"]
        if name and name in seen:
            errors.add(f"{path}.name", f"{_show(name)} is used by another task group of this job")
        seen.add(name)
        total += group["replicas"]
        groups.append(group)
    if total > limit("TASKS_PER_JOB"):
        errors.add("tasks", f"at most {limit('TASKS_PER_JOB')} tasks in all, got {total}")
    return groups, total


def _task_group(
    errors: _Errors, task: dict[str, Any], path: str, default_name: str | None
) -> dict[str, Any]:
    _unknown(errors, task, TASK_FIELDS, path)
    return {
        "name": _name(errors, task.get("name", default_name), f"{path}.name"),
        "replicas": _int(
            errors,
            task,
            "replicas",
            f"{path}.replicas",
            default=1,
            minimum=1,
            maximum=limit("TASKS_PER_JOB"),
        )
        or 1,  # fmt: skip
        "command": _command(errors, task.get("command"), f"{path}.command"),
        "env": _str_map(errors, task.get("env"), f"{path}.env", env=True),
        "resources": _resources(errors, task.get("resources"), f"{path}.resources"),
        "node_selector": _str_map(errors, task.get("node_selector"), f"{path}.node_selector"),
    }


def with_queue_defaults(spec: dict[str, Any], cpu: int, memory: int) -> dict[str, Any]:
    """`spec` (normalized) with each task group's absent cpu and memory set to its queue's
    defaults (millicores, bytes): what is stored is what the scheduler places."""
    out = copy.deepcopy(spec)
    for task in out["tasks"]:
        task["resources"] = {"cpu": format_cpu(cpu), "memory": format_memory(memory),
                             **task["resources"]}  # fmt: skip
    return out


def array_max_elements() -> int:
    """The largest array a spec may ask for (setting BERTH_ARRAY_MAX_ELEMENTS)."""
    from django.conf import settings  # settings only, no database: specs stay pure

    return int(getattr(settings, "BERTH_ARRAY_MAX_ELEMENTS", 100_000))


def array_max_tasks() -> int:
    """The most task rows one array may create (setting BERTH_ARRAY_MAX_TASKS)."""
    from django.conf import settings

    return int(getattr(settings, "BERTH_ARRAY_MAX_TASKS", 200_000))


def _array(errors: _Errors, value: object) -> tuple[str, int]:
    """An array expression ("0-999%10"), checked and kept as written (without spaces), and
    its number of elements."""
    try:
        parsed = parse_array(value, array_max_elements())
    except ArraySpecError as exc:
        errors.add("array", str(exc))
        return "", 0
    return parsed.text, len(parsed.indices)


def normalize_template_spec(data: object) -> dict[str, Any]:
    errors = _Errors()
    if not isinstance(data, dict):
        raise SpecError({"spec": [f"must be a mapping, got {type(data).__name__}"]})
    _unknown(errors, data, {"name", "description", "spec"}, "")
    name = _name(errors, data.get("name"), "name")
    description = data.get("description", "")
    if not isinstance(description, str):
        errors.add("description", "must be a string")
        description = ""
    elif (problem := _too_long(description, limit("TEXT_BYTES"))) is not None:
        errors.add("description", problem)
    spec: dict[str, Any] = {}
    if not isinstance(data.get("spec"), dict):
        errors.add("spec", "is required: a job spec without name")
    else:
        if "name" in data["spec"]:
            errors.add("spec.name", "a template's job takes its name from the flow step")
        if "array" in data["spec"]:
            errors.add("spec.array", "not in a template: a flow step fans out with items")
        try:
            spec = normalize_job_spec(
                {k: v for k, v in data["spec"].items() if k != "name"}, name_required=False
            )
        except SpecError as exc:
            for path, messages in exc.errors.items():
                for message in messages:
                    errors.add(f"spec.{path}", message)
    errors.raise_if_any()
    return {"name": name, "description": description, "spec": spec}


def normalize_flow_spec(data: object) -> dict[str, Any]:
    errors = _Errors()
    if not isinstance(data, dict):
        raise SpecError({"spec": [f"must be a mapping, got {type(data).__name__}"]})
    _unknown(errors, data, FLOW_FIELDS, "")
    flow: dict[str, Any] = {
        "name": _name(errors, data.get("name"), "name"),
        "parallelism": _int(errors, data, "parallelism", "parallelism", default=None, minimum=1,
                            maximum=MAX_INT),
        "fail_fast": _bool(errors, data, "fail_fast", "fail_fast", False),
        "ttl_seconds_after_finished": _duration(
            errors, data, "ttl_seconds_after_finished", "ttl_seconds_after_finished",
            minimum=0, maximum=MAX_INT,
        ),
        "steps": [],
    }  # fmt: skip
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        errors.add("steps", "must be a non-empty list of steps")
        steps = []
    elif len(steps) > limit("FLOW_STEPS"):
        errors.add("steps", f"at most {limit('FLOW_STEPS')} steps, got {len(steps)}")
        steps = []
    names: dict[str, int] = {}
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            errors.add(f"steps.{i}", f"must be a mapping, got {type(step).__name__}")
            continue
        normalized = _flow_step(errors, step, f"steps.{i}", len(steps))
        name = normalized["name"]
        if name in names:
            errors.add(f"steps.{i}.name", f"{_show(name)} repeats the name of step {names[name]}")
        elif name:
            names[name] = i
        flow["steps"].append(normalized)
    _check_dependencies(errors, flow["steps"], names)
    errors.raise_if_any()
    return flow


def _flow_step(errors: _Errors, step: dict[str, Any], path: str, count: int) -> dict[str, Any]:
    """One step: its name, exactly one of `template` (a staff-made template's name) or `spec`
    (an inline job spec without name), dependencies, overrides and items."""
    _unknown(errors, step, STEP_FIELDS, path)
    out: dict[str, Any] = {"name": _name(errors, step.get("name"), f"{path}.name")}
    if step.get("spec") is not None:
        if step.get("template") is not None:
            errors.add(path, "give either template or spec, not both")
        out["spec"] = _inline_spec(errors, step["spec"], f"{path}.spec")
    elif step.get("template") is not None:
        out["template"] = _name(errors, step["template"], f"{path}.template")
    else:
        errors.add(f"{path}.template", "is required (or spec: an inline job spec without name)")
        out["template"] = ""
    depends = step.get("depends_on", [])
    if (
        not isinstance(depends, list)
        or len(depends) > count
        or not all(isinstance(d, str) for d in depends)
    ):
        errors.add(f"{path}.depends_on", "must be a list of step names")
        depends = []
    out["depends_on"] = list(depends)
    out["overrides"] = _overrides(errors, step.get("overrides"), f"{path}.overrides")
    out["items"] = _items(errors, step.get("items"), f"{path}.items")
    return out


def _inline_spec(errors: _Errors, value: object, path: str) -> dict[str, Any]:
    """A step's own job spec, checked with the rules and limits of a job; its errors are
    named under the step (`steps.2.spec.tasks.0.resources.gpu`)."""
    if not isinstance(value, dict):
        errors.add(path, f"must be a job spec without name, got {type(value).__name__}")
        return {}
    if "name" in value:
        errors.add(f"{path}.name", "a step's job takes its name from the flow step")
    if "array" in value:
        errors.add(f"{path}.array", "not in a flow step: a step fans out with items")
    try:
        return normalize_job_spec(
            {k: v for k, v in value.items() if k not in ("name", "array")}, name_required=False
        )
    except SpecError as exc:
        for where, messages in exc.errors.items():
            for message in messages:
                errors.add(f"{path}.{where}", message)
    return {}


def _items(errors: _Errors, items: object, path: str) -> list[dict[str, str]] | None:
    """A step's items (one job each, its keys the job's environment variables), or None."""
    if items is None:
        return None
    if not isinstance(items, list) or not items:
        errors.add(path, "must be a non-empty list of objects (one job each)")
        return None
    if len(items) > limit("FLOW_ITEMS"):
        errors.add(path, f"at most {limit('FLOW_ITEMS')} items, got {len(items)}")
        return None
    cleaned = []
    for j, item in enumerate(items):
        if not isinstance(item, dict):
            errors.add(f"{path}.{j}", f"must be an object, got {type(item).__name__}")
            continue
        cleaned.append(_str_map(errors, item, f"{path}.{j}", env=True))
    return cleaned


def _check_dependencies(
    errors: _Errors, steps: list[dict[str, Any]], names: dict[str, int]
) -> None:
    for i, step in enumerate(steps):
        for dep in step["depends_on"]:
            if dep not in names:
                errors.add(f"steps.{i}.depends_on", f"unknown step {_show(dep)}")
            elif dep == step["name"]:
                errors.add(f"steps.{i}.depends_on", f"step {_show(dep)} depends on itself")
    cycle = find_cycle({s["name"]: s["depends_on"] for s in steps if s["name"]})
    if cycle:
        if len(cycle) <= 10:
            errors.add("steps", f"cycle {' -> '.join(cycle)}")
        else:  # a long one, shown by its ends
            shown = " -> ".join([*cycle[:5], "...", *cycle[-5:]])
            errors.add("steps", f"cycle of {len(cycle) - 1} steps: {shown}")


def job_int_bounds() -> dict[str, tuple[int, int]]:
    """The range of each whole-number field of a job: step overrides and Job.clean() (the
    admin) check these, as normalize_job_spec does."""
    return {
        "priority": (-limit("PRIORITY"), limit("PRIORITY")),
        "max_retry": (0, 100),
        "min_available": (1, MAX_INT),
        **{key: (minimum, limit("SECONDS")) for key, minimum in SECONDS_FIELDS.items()},
    }


def job_field_problems(values: dict[str, Any]) -> dict[str, list[str]]:
    """What is wrong with a job's whole-number fields, in the words a spec would get."""
    errors = _Errors()
    for key, (low, high) in job_int_bounds().items():
        if key in values:
            _int(errors, values, key, key, default=None, minimum=low, maximum=high)
    return errors.errors


def _overrides(errors: _Errors, value: object, path: str) -> dict[str, Any]:
    """A step's overrides, each checked as the same field of a job spec would be."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(path, f"must be a mapping, got {type(value).__name__}")
        return {}
    _unknown(errors, value, OVERRIDE_JOB | OVERRIDE_TASK, path)
    out: dict[str, Any] = {}
    ints = {**job_int_bounds(), "replicas": (1, limit("TASKS_PER_JOB"))}
    for key in sorted(set(value) & (OVERRIDE_JOB | OVERRIDE_TASK)):
        where = _path(path, key)
        if key in SECONDS_FIELDS:
            out[key] = _duration(errors, value, key, where, minimum=SECONDS_FIELDS[key],
                                 maximum=limit("SECONDS"))  # fmt: skip
        elif key in ints:
            low, high = ints[key]
            out[key] = _int(errors, value, key, where, default=None, minimum=low, maximum=high)
        elif key == "preemptible":
            out[key] = _bool(errors, value, key, where, True)
        elif key == "queue":
            out[key] = _name(errors, value[key], where)
        elif key == "command":
            out[key] = _command(errors, value[key], where)
        elif key == "env":
            out[key] = _str_map(errors, value[key], where, env=True)
        elif key == "node_selector":
            out[key] = _str_map(errors, value[key], where)
        elif key == "resources":
            out[key] = _resources(errors, value[key], where, fill=False)
    return out


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A dependency cycle as a closed path (a -> b -> a), or None. Iterative (an explicit
    stack), so a chain of thousands of steps never reaches Python's recursion limit."""
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        path: list[str] = [root]  # the current chain of dependencies
        on_path = {root}
        pending: list[list[str]] = [graph.get(root, [])[::-1]]  # popped from the end
        while path:
            deps = pending[-1]
            if not deps:
                done.add(path[-1])
                on_path.discard(path.pop())
                pending.pop()
                continue
            dep = deps.pop()
            if dep not in graph or dep == path[-1] or dep in done:
                continue
            if dep in on_path:
                return path[path.index(dep) :] + [dep]
            path.append(dep)
            on_path.add(dep)
            pending.append(graph.get(dep, [])[::-1])
    return None


def step_job_spec(
    template_spec: dict[str, Any], overrides: dict[str, Any], item: dict[str, str] | None,
    *, name: str,
) -> dict[str, Any]:  # fmt: skip
    """A flow step's job: the template's spec, then the step's overrides, then the item's
    keys as environment variables of every task."""
    spec = copy.deepcopy(template_spec)
    spec["name"] = name
    for key in OVERRIDE_JOB & set(overrides):
        spec[key] = overrides[key]
    for task in spec.get("tasks", []):
        for key in OVERRIDE_TASK & set(overrides):
            if key == "env":
                task["env"] = {**task.get("env", {}), **overrides["env"]}
            elif key == "resources":
                task["resources"] = {**task.get("resources", {}), **overrides["resources"]}
            else:
                task[key] = copy.deepcopy(overrides[key])
        if item:
            task["env"] = {**task.get("env", {}), **item}
    if "replicas" in overrides and "min_available" not in overrides:
        spec.pop("min_available", None)  # recomputed from the new replica count
    return normalize_job_spec(spec)
