"""What the agent enforces on its tasks, and how a task's cgroup lives and ends (Django-free).

The agent asks this module, per task: make its cgroup with the limits of its start order, put
its first process in it, signal everything in it, tell whether the kernel killed something for
memory, and at the end kill what is left and say what it used. The node states what it
enforces (`describe()`, sent when it registers); with `--enforce required` (the default as
root) a node that cannot enforce memory, CPU, pids, process tracking and (when it has GPU
device nodes) devices runs nothing.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.agent.cgroups import (
    REQUIRED,
    Found,
    Hierarchy,
    Limits,
    TaskCgroup,
    Usage,
    detect,
    gpu_device_nodes,
)

log = logging.getLogger("berth.agent")
MODES = ("required", "best-effort")
DEFAULT_PIDS_LIMIT = 4096
OUT_OF_MEMORY = "OutOfMemory"


@dataclass
class Ended:
    """How a task's cgroup ended: what it used, whether the kernel killed it for memory, and
    how many processes were still there (killed now: daemons, background children)."""

    usage: Usage
    out_of_memory: bool
    leftovers: int


def mebibytes(amount: int | None) -> str:
    return "?" if amount is None else f"{amount / 2**20:.0f}Mi"


def nvidia_nodes(folder: Path = Path("/dev")) -> dict[int, str]:
    """GPU index -> its device node: /dev/nvidiaN (the driver numbers them as NVML does
    unless configured otherwise)."""
    found = {}
    for path in folder.glob("nvidia[0-9]*"):
        if path.name[len("nvidia") :].isdigit():
            found[int(path.name[len("nvidia") :])] = str(path)
    return found


def default_mode() -> str:
    return "required" if os.geteuid() == 0 else "best-effort"


class Fence:
    """The cgroups of one agent's tasks (none when not root, or none found)."""

    def __init__(self, mode: str | None = None, base_name: str = "berth",
                 pids_limit: int = DEFAULT_PIDS_LIMIT, gpu_nodes: dict[int, str] | None = None,
                 finder: Callable[[str], Found] = detect,
                 allow: tuple[str, ...] = ()) -> None:  # fmt: skip
        if mode is not None and mode not in MODES:
            raise ValueError(f"must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode or default_mode()
        self.base_name = base_name
        self.pids_limit = pids_limit
        self.allow = allow  # devices.allow rules every task gets besides BASE_DEVICES
        self.gpu_nodes = dict(gpu_nodes) if gpu_nodes is not None else nvidia_nodes()
        self.finder = finder
        self.hierarchy: Hierarchy | None = None
        self.problem = ""  # why a required node runs nothing ("" when it runs tasks)
        self.missing: tuple[str, ...] = ()
        self.ready = False
        self.groups: dict[str, TaskCgroup] = {}  # opened once: polled every 50 ms

    def setup(self) -> None:
        """Find the cgroups (once) and decide what is enforced."""
        if self.ready:
            return
        found = self.finder(self.base_name)
        self.hierarchy = found.hierarchy
        enforced = set(self.hierarchy.enforced if self.hierarchy else ())
        needed = [*REQUIRED, *(["devices"] if self.gpu_nodes else [])]
        self.missing = tuple(n for n in needed if n not in enforced)
        if self.missing:
            text = f"cannot enforce {', '.join(self.missing)}: {self._why(found)}"
            if self.mode == "required":
                self.problem = f"{text} (--enforce required: this node runs no tasks)"
                log.error("%s", self.problem)
            else:
                log.warning("%s (--enforce best-effort: tasks run without them)", text)
        self.ready = True

    def _why(self, found: Found) -> str:
        if found.problem:
            return found.problem
        reasons = self.hierarchy.reasons if self.hierarchy else {}
        unexplained = [n for n in self.missing if n not in reasons]
        parts = [reasons[n] for n in self.missing if n in reasons]
        if unexplained:
            parts.insert(0, f"the {self._version()} cgroups here lack {', '.join(unexplained)}")
        return "; ".join(parts)

    def _version(self) -> str:
        return self.hierarchy.version if self.hierarchy else "no"

    @property
    def refuses(self) -> bool:
        return bool(self.problem)

    def describe(self) -> dict[str, Any]:
        """What this node enforces, for its registration (the node page, `berth nodes`,
        /metrics)."""
        return {
            "mode": self.mode,
            "cgroup": self.hierarchy.version if self.hierarchy else "",
            "enforced": sorted(self.hierarchy.enforced) if self.hierarchy else [],
            "missing": list(self.missing),
            "problem": self.problem,
            "pids_limit": self.pids_limit,
            "allowed_devices": list(self.allow),
        }

    def limits(self, order: dict[str, Any], devices: Iterable[int]) -> Limits:
        resources = order.get("resources") if isinstance(order.get("resources"), dict) else {}
        assert isinstance(resources, dict)
        return Limits(
            memory=_whole(resources.get("memory")),
            cpu=_whole(resources.get("cpu")),
            pids=_whole(resources.get("pids")) or self.pids_limit,
            devices=gpu_device_nodes(devices, self.gpu_nodes),
            allow=self.allow,
        )

    def create(self, name: str, limits: Limits) -> str:
        """Make the task's cgroup; its name ("" when this node makes none)."""
        if self.hierarchy is None:
            return ""
        self.groups[name] = self.hierarchy.create(name, limits)
        return name

    def _group(self, name: str) -> TaskCgroup | None:
        if not name or self.hierarchy is None:
            return None
        if name not in self.groups:
            group = self.hierarchy.open(name)
            if group is None:
                return None
            self.groups[name] = group
        return self.groups[name]

    def add(self, name: str, pid: int) -> None:
        group = self._group(name)
        if group is not None:
            group.add(pid)

    def signal_all(self, name: str, sig: int) -> None:
        """Signal every process of the task, in whatever session or group it went to."""
        group = self._group(name)
        for pid in group.pids() if group is not None else []:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, name: str) -> None:
        group = self._group(name)
        if group is not None:
            group.kill_all()

    def out_of_memory(self, name: str) -> bool:
        """Whether the kernel has killed a process of the task for memory."""
        group = self._group(name)
        return group is not None and group.usage().oom_kills > 0

    def usage(self, name: str) -> Usage | None:
        group = self._group(name)
        return None if group is None else group.usage()

    def end(self, name: str) -> Ended | None:
        """The task ended: kill what is left in its cgroup, read what it used, remove it."""
        group = self._group(name)
        if group is None:
            return None
        self.groups.pop(name, None)
        leftovers = group.kill_all()
        usage = group.usage()
        if not group.remove():
            log.warning("could not remove the cgroup of %s: processes are still in it", name)
        return Ended(usage, usage.oom_kills > 0, leftovers)

    def reap(self, keep: set[str]) -> list[str]:
        """After a restart: kill and remove the cgroups of tasks that are no longer ours to
        run (ended while the agent was down, or forgotten); returns their names."""
        if self.hierarchy is None:
            return []
        reaped = []
        for name in self.hierarchy.names():
            if name in keep:
                continue
            self.end(name)
            reaped.append(name)
        return reaped

    def close(self) -> None:
        """The agent stops with no task left: remove its folder of task cgroups."""
        if self.hierarchy is not None and not self.hierarchy.names():
            self.hierarchy.remove_base()


def start_gated(
    start: Callable[[int], subprocess.Popen[bytes]], admit: Callable[[int], None]
) -> subprocess.Popen[bytes]:
    """Start a process that waits on a pipe before it runs anything: `start` gets the pipe's
    end to read from; once `admit(pid)` has put the process where it belongs (its cgroup) it
    is told to go on. A process that cannot be admitted (OSError) is killed and waited for;
    the pipe is closed either way."""
    gate, go = os.pipe()
    try:
        proc = start(gate)
        os.close(gate)
        gate = -1
        try:
            admit(proc.pid)
            os.write(go, b"go\n")  # BrokenPipeError if it died first (a failed mount)
        except OSError:
            proc.kill()
            proc.wait()
            raise
    finally:
        for fd in (gate, go):
            if fd >= 0:
                os.close(fd)
    return proc


def oom_message(usage: Usage, requested: int) -> str:
    limit = usage.memory_limit if usage.memory_limit else requested
    return (
        f"out of memory: the kernel killed it at its memory limit {mebibytes(limit)}"
        f" (peak {mebibytes(usage.peak_memory)})"
    )


def usage_report(usage: Usage | None) -> dict[str, Any] | None:
    """A task end's `usage` in a report."""
    if usage is None:
        return None
    return {"peak_memory": usage.peak_memory, "cpu_seconds": usage.cpu_seconds,
            "memory_limit": usage.memory_limit}  # fmt: skip


def _whole(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
