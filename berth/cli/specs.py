"""Job specs from what users type: command-line options, `#BERTH` script directives (read the
way `sbatch` reads `#SBATCH` lines), YAML/JSON files, and durations like `1h30m`."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from berth.cli.client import CliError
from scheduler.core import duration

DIRECTIVE = "#BERTH"


def parse_duration(text: str) -> int:
    """Seconds from `--time` (or a `#BERTH --time` line): the server's own duration forms
    (scheduler/core/duration.py): `90`, `90s`, `1h30m`, `2d`, `01:30:00`, `30:00` (MM:SS),
    `1-12:00:00` (D-HH:MM:SS) or `2-3` (D-HH)."""
    try:
        return duration.parse_duration(text)
    except duration.DurationError as exc:
        raise CliError(f"--time: {exc}") from None


def directives(script: str) -> list[str]:
    """The options on `#BERTH` lines at the top of a script, before its first command."""
    args: list[str] = []
    for line in script.splitlines()[1 if script.startswith("#!") else 0 :]:
        stripped = line.strip()
        if stripped.startswith(DIRECTIVE):
            try:
                args.extend(shlex.split(stripped[len(DIRECTIVE) :], comments=True))
            except ValueError as exc:
                raise CliError(f"{DIRECTIVE} line {stripped!r}: {exc}") from None
        elif stripped and not stripped.startswith("#"):
            break
    return args


def is_script(text: str) -> bool:
    return text.startswith("#!") or any(
        line.strip().startswith(DIRECTIVE) for line in text.splitlines()
    )


def load_spec_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON job/flow spec."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise CliError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                       f"{str(exc)[:300]}") from None  # fmt: skip
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a mapping (a job spec), got {type(data).__name__}")
    return data


def _number(text: object) -> object:
    """A count as JSON writes it ("2" -> 2, "0.25" -> 0.25); anything else as given, for
    the server to refuse naming the field."""
    for kind in (int, float):
        try:
            return kind(str(text))
        except ValueError:
            continue
    return text


def job_from_options(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """One task running `command` with the resources the options ask for."""
    resources: dict[str, Any] = {}
    if options.get("cpu") is not None:
        resources["cpu"] = options["cpu"]
    if options.get("mem") is not None:
        resources["memory"] = options["mem"]
    if options.get("gpus") is not None:
        resources["gpu"] = _number(options["gpus"])
    if options.get("gpu_mem") is not None:
        resources["gpu_memory"] = options["gpu_mem"]
    task: dict[str, Any] = {"name": "main", "command": command}
    if resources:
        task["resources"] = resources
    words = shlex.split(command, comments=True) if command.strip() else []
    default_name = Path(words[0]).name if words else "job"
    spec: dict[str, Any] = {"name": options.get("name") or safe_name(default_name),
                            "tasks": [task]}  # fmt: skip
    return apply_job_options(spec, options)


def apply_job_options(spec: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Options that mean the same for any spec override what the spec (or script) says."""
    out = dict(spec)
    if options.get("name"):
        out["name"] = options["name"]
    if options.get("queue"):
        out["queue"] = options["queue"]
    if options.get("time"):
        out["walltime"] = parse_duration(options["time"])
    if options.get("array"):
        out["array"] = options["array"]
    if options.get("priority") is not None:
        out["priority"] = options["priority"]
    if options.get("app"):
        out["apps"] = [{"kind": options["app"]}]  # the server checks the kind (apps.0.kind)
    return _apply_notify(out, options)


def _apply_notify(spec: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """--notify EVENTS and --notify-webhook URL over the spec's `notify` (the server checks
    both: a bad event or a host it does not allow is a 400 naming the field)."""
    events, webhook = options.get("notify"), options.get("notify_webhook")
    if events is None and webhook is None:
        return spec
    given = spec.get("notify")
    notify = dict(given) if isinstance(given, dict) else {"events": given or []}
    if events is not None:
        notify["events"] = events
    if webhook is not None:
        notify["webhook"] = webhook
    return {**spec, "notify": notify}


def safe_name(text: str) -> str:
    """A job name the server accepts (lowercase letters, digits, '-', '_', '.')."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", text.lower())[:63].strip("-._")
    return name or "job"
