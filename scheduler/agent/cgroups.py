"""One cgroup per task: the limits a task asked for, enforced by the kernel (Django-free).

Slurm's task/cgroup and proctrack/cgroup, in small: an agent running as root makes a cgroup
for each task under its own cgroup (read from /proc/self/cgroup, so an agent already placed in
a nested cgroup, or a systemd unit with `Delegate=yes`, keeps its tasks inside what it was
given) and starts the task in it. One interface, two implementations:

- `V1` (the per-controller hierarchies: memory, cpu, cpuacct, pids, devices, freezer):
  memory.limit_in_bytes (and memory.memsw.limit_in_bytes where swap is accounted), a CFS quota,
  pids.max, a devices allowlist, and the freezer to kill every process of the task at once.
- `V2` (the unified hierarchy, delegated): memory.max with memory.swap.max 0 and
  memory.oom.group, cpu.max, pids.max, cgroup.freeze / cgroup.kill, and the devices allowlist
  as an eBPF device program attached to the task's cgroup (scheduler/agent/devicebpf.py) where
  the kernel lets the agent attach one.

Every process a task starts stays in its cgroup (a `setsid` daemon or a double fork included),
so ending a task is: freeze the cgroup, SIGKILL every process in it, thaw it, remove it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.agent import devicebpf

log = logging.getLogger("berth.agent")
ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices", "freezer")
V2_CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel refuses a CFS quota under 1 ms
# What every task may open whatever its GPUs (as container runtimes allow): the null, zero,
# full, random and urandom devices, ttys and pseudo-terminals; mknod of anything (opening it
# is still checked).
BASE_DEVICES = (
    "c *:* m", "b *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
    "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 136:* rwm",
)  # fmt: skip
# GPU control nodes every GPU task needs besides its own /dev/nvidiaN.
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                     "/dev/nvidia-modeset")  # fmt: skip
# What `--enforce required` needs: without one of them a node runs nothing ("devices" only
# when the node has GPU device nodes to fence).
REQUIRED = ("memory", "cpu", "pids", "tracking")
SETTLE_SECONDS = 2.0  # how long a kill waits for the kernel to empty a cgroup


@dataclass(frozen=True)
class Limits:
    """What a task may use: bytes (0: no limit), millicores (0: no limit), processes (0: no
    limit) and the device nodes it may open besides BASE_DEVICES."""

    memory: int = 0
    cpu: int = 0
    pids: int = 0
    devices: tuple[str, ...] = ()  # paths of character devices (its GPUs and their controls)
    # More devices.allow rules every task of the node gets (run_agent --allow-device)
    allow: tuple[str, ...] = ()


@dataclass
class Usage:
    """What a task's cgroup says it used so far (None: this kernel does not say)."""

    peak_memory: int | None = None
    cpu_seconds: float | None = None
    oom_kills: int = 0
    memory_limit: int | None = None


class TaskCgroup(ABC):
    """A task's cgroup (in every controller it spans)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def add(self, pid: int) -> None:
        """Move `pid` (and so everything it starts from then on) into the cgroup."""

    @abstractmethod
    def pids(self) -> list[int]:
        """Every process in the cgroup."""

    @abstractmethod
    def usage(self) -> Usage: ...

    @abstractmethod
    def _freeze(self, frozen: bool) -> None: ...

    def kill_all(self) -> int:
        """SIGKILL every process in the cgroup, frozen so that none can fork meanwhile;
        returns how many were signalled. Waits (briefly) until the kernel has emptied it."""
        killed = 0
        for _ in range(5):  # a process moving in between two reads is caught next time
            self._freeze(True)
            found = self.pids()
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            self._freeze(False)  # a frozen process cannot die
            if not found:
                break
        _wait_empty(self)
        return killed

    @abstractmethod
    def remove(self) -> bool:
        """Remove the (empty) cgroup; False if it still holds processes."""


class Hierarchy(ABC):
    """Where task cgroups are made, and which limits this machine can enforce."""

    version = ""

    def __init__(self, base_name: str) -> None:
        self.base_name = base_name  # the agent's folder of task cgroups, under its own cgroup
        self.enforced: tuple[str, ...] = ()
        self.reasons: dict[str, str] = {}  # limit -> why it is not enforced, where known

    @abstractmethod
    def create(self, name: str, limits: Limits) -> TaskCgroup: ...

    @abstractmethod
    def open(self, name: str) -> TaskCgroup | None:
        """The existing task cgroup `name` (after a restart), or None."""

    @abstractmethod
    def names(self) -> list[str]:
        """The task cgroups that exist under this agent's folder."""

    @abstractmethod
    def remove_base(self) -> None:
        """Remove the agent's (empty) folder of task cgroups."""


# --- v1 --------------------------------------------------------------------------------


class V1Cgroup(TaskCgroup):
    def __init__(self, name: str, dirs: dict[str, Path]) -> None:
        super().__init__(name)
        self.dirs = dirs  # controller -> this task's directory in it

    def add(self, pid: int) -> None:
        for directory in _unique(self.dirs.values()):
            _write(directory / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in _unique(self.dirs.values()):
            found.update(_read_pids(directory / "cgroup.procs"))
        return sorted(found)

    def usage(self) -> Usage:
        memory, cpuacct = self.dirs.get("memory"), self.dirs.get("cpuacct")
        result = Usage()
        if memory is not None:
            result.peak_memory = _read_int(memory / "memory.max_usage_in_bytes")
            result.oom_kills = _keyed(memory / "memory.oom_control").get("oom_kill", 0)
            result.memory_limit = _read_int(memory / "memory.limit_in_bytes")
        if cpuacct is not None:
            nanoseconds = _read_int(cpuacct / "cpuacct.usage")
            result.cpu_seconds = None if nanoseconds is None else nanoseconds / 1e9
        return result

    def _freeze(self, frozen: bool) -> None:
        freezer = self.dirs.get("freezer")
        if freezer is None:
            return
        state = "FROZEN" if frozen else "THAWED"
        _write(freezer / "freezer.state", state)
        deadline = time.monotonic() + SETTLE_SECONDS
        while frozen and time.monotonic() < deadline:
            if (freezer / "freezer.state").read_text().strip() == state:
                return
            time.sleep(0.005)

    def remove(self) -> bool:
        return all(_rmdir(d) for d in _unique(self.dirs.values()))


class V1(Hierarchy):
    """The v1 controllers, each mounted on its own (or several together)."""

    version = "v1"

    def __init__(self, base_name: str, mounts: dict[str, Path], own: dict[str, str]) -> None:
        super().__init__(base_name)
        # controller -> the agent's folder of task cgroups in that controller's hierarchy
        self.bases = {c: mounts[c] / own.get(c, "/").lstrip("/") / base_name for c in mounts}
        enforced: list[str] = [c for c in ("memory", "cpu", "pids", "devices") if c in mounts]
        if "memory" in mounts and (self.bases["memory"].parent / "memory.memsw.limit_in_bytes"
                                   ).exists():  # fmt: skip
            enforced.append("swap")
        if "freezer" in mounts:
            enforced.append("tracking")
        self.enforced = tuple(enforced)

    def create(self, name: str, limits: Limits) -> V1Cgroup:
        dirs = {c: base / name for c, base in self.bases.items()}
        for directory in _unique(dirs.values()):
            directory.mkdir(parents=True, exist_ok=True)
        group = V1Cgroup(name, dirs)
        try:
            self._limit(dirs, limits)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, dirs: dict[str, Path], limits: Limits) -> None:
        if limits.memory and "memory" in dirs:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory))
            if "swap" in self.enforced:  # memory + swap = the request: no swap on top
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory))
        if limits.cpu and "cpu" in dirs:
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(_quota_us(limits.cpu)))
        if limits.pids and "pids" in dirs:
            _write(dirs["pids"] / "pids.max", str(limits.pids))
        if "devices" in dirs:
            _write(dirs["devices"] / "devices.deny", "a")
            for rule in (*BASE_DEVICES, *limits.allow, *device_rules(limits.devices)):
                _write(dirs["devices"] / "devices.allow", rule)

    def open(self, name: str) -> V1Cgroup | None:
        dirs = {c: base / name for c, base in self.bases.items()}
        if not any(d.is_dir() for d in dirs.values()):
            return None
        return V1Cgroup(name, {c: d for c, d in dirs.items() if d.is_dir()})

    def names(self) -> list[str]:
        found: set[str] = set()
        for base in self.bases.values():
            if base.is_dir():
                found.update(p.name for p in base.iterdir() if p.is_dir())
        return sorted(found)

    def remove_base(self) -> None:
        for base in _unique(self.bases.values()):
            _rmdir(base)


# --- v2 --------------------------------------------------------------------------------


class V2Cgroup(TaskCgroup):
    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name)
        self.path = path

    def add(self, pid: int) -> None:
        _write(self.path / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        return sorted(_read_pids(self.path / "cgroup.procs"))

    def usage(self) -> Usage:
        cpu = _keyed(self.path / "cpu.stat").get("usage_usec")
        limit = _read_int(self.path / "memory.max")
        return Usage(
            peak_memory=_read_int(self.path / "memory.peak"),  # Linux 5.19+
            cpu_seconds=None if cpu is None else cpu / 1e6,
            oom_kills=_keyed(self.path / "memory.events").get("oom_kill", 0),
            memory_limit=limit,
        )

    def _freeze(self, frozen: bool) -> None:
        if (self.path / "cgroup.freeze").exists():
            _write(self.path / "cgroup.freeze", "1" if frozen else "0")

    def kill_all(self) -> int:
        if not (self.path / "cgroup.kill").exists():  # before Linux 5.14
            return super().kill_all()
        count = len(self.pids())
        _write(self.path / "cgroup.kill", "1")  # the kernel kills all of it, forks included
        _wait_empty(self)
        return count

    def remove(self) -> bool:
        return _rmdir(self.path)


class V2(Hierarchy):
    """A delegated subtree of the unified hierarchy (systemd `Delegate=yes`): the agent's own
    cgroup. A v2 cgroup with controllers enabled for its children may hold no process itself,
    so the agent first moves the processes of its cgroup into a leaf of its own (`agent`)."""

    version = "v2"

    def __init__(self, base_name: str, own: Path) -> None:
        super().__init__(base_name)
        self.own = own
        self.base = own / base_name
        available = set(_read_words(own / "cgroup.controllers"))
        self.controllers = [c for c in V2_CONTROLLERS if c in available]
        enforced = list(self.controllers)
        if "memory" in available and (own / "memory.swap.max").exists():
            enforced.append("swap")
        enforced.append("tracking")  # cgroup.procs of a leaf we own; cgroup.kill or freeze
        self.enforced = tuple(enforced)

    def prepare(self) -> None:
        """Move the agent out of its own cgroup into a leaf and hand the controllers down."""
        leaf = self.own / "agent"
        if _read_pids(self.own / "cgroup.procs"):
            leaf.mkdir(exist_ok=True)
            for pid in _read_pids(self.own / "cgroup.procs"):
                try:
                    _write(leaf / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass
        wanted = " ".join(f"+{c}" for c in self.controllers)
        if wanted:
            _write(self.own / "cgroup.subtree_control", wanted)
        self.base.mkdir(exist_ok=True)
        if wanted:
            _write(self.base / "cgroup.subtree_control", wanted)
        problem = devicebpf.probe(self.base, BASE_DEVICES)
        if problem:
            self.reasons["devices"] = f"no eBPF device program on cgroup v2: {problem}"
        elif "devices" not in self.enforced:
            self.enforced = (*self.enforced, "devices")

    def create(self, name: str, limits: Limits) -> V2Cgroup:
        path = self.base / name
        path.mkdir(exist_ok=True)
        group = V2Cgroup(name, path)
        try:
            self._limit(path, limits)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, path: Path, limits: Limits) -> None:
        if limits.memory and "memory" in self.controllers:
            _write(path / "memory.max", str(limits.memory))
            if (path / "memory.swap.max").exists():
                _write(path / "memory.swap.max", "0")
            if (path / "memory.oom.group").exists():
                _write(path / "memory.oom.group", "1")  # an OOM kill takes the whole task
        if limits.cpu and "cpu" in self.controllers:
            _write(path / "cpu.max", f"{_quota_us(limits.cpu)} {CFS_PERIOD_US}")
        if limits.pids and "pids" in self.controllers:
            _write(path / "pids.max", str(limits.pids))
        if "devices" in self.enforced:  # replaces the program of an earlier life of the cgroup
            devicebpf.attach(path, (*BASE_DEVICES, *limits.allow, *device_rules(limits.devices)))

    def open(self, name: str) -> V2Cgroup | None:
        path = self.base / name
        return V2Cgroup(name, path) if path.is_dir() else None

    def names(self) -> list[str]:
        if not self.base.is_dir():
            return []
        return sorted(p.name for p in self.base.iterdir()
                      if p.is_dir() and p.name != devicebpf.PROBE_NAME)  # fmt: skip

    def remove_base(self) -> None:
        _rmdir(self.base)


# --- finding the hierarchy -------------------------------------------------------------


@dataclass
class Found:
    """What detect() found: a hierarchy, or why there is none."""

    hierarchy: Hierarchy | None
    problem: str = ""
    mounts: dict[str, Path] = field(default_factory=dict)


def detect(base_name: str, mountinfo: Path = Path("/proc/self/mountinfo"),
           self_cgroup: Path = Path("/proc/self/cgroup")) -> Found:  # fmt: skip
    """This machine's cgroups: v2 when the unified hierarchy has controllers for us, else
    the v1 controllers; an agent that is not root makes no cgroups."""
    if os.geteuid() != 0:
        return Found(None, "the agent is not root: it cannot make cgroups")
    try:
        mounts_v1, mount_v2 = _mounts(mountinfo.read_text())
        own = _own_paths(self_cgroup.read_text())
    except OSError as exc:
        return Found(None, f"cannot read the cgroup mounts: {exc}")
    if mount_v2 is not None and "" in own:
        path = mount_v2 / own[""].lstrip("/")
        if set(_read_words(path / "cgroup.controllers")) >= {"memory", "cpu", "pids"}:
            hierarchy = V2(base_name, path)
            try:
                hierarchy.prepare()
            except OSError as exc:
                return Found(None, f"cgroup v2 at {path} is not delegated to us: {exc}")
            return Found(hierarchy)
    if "memory" in mounts_v1:
        return Found(V1(base_name, mounts_v1, own), mounts=mounts_v1)
    return Found(None, "neither cgroup v2 controllers nor the v1 memory controller are here")


def own_dirs(mountinfo: Path = Path("/proc/self/mountinfo"),
             self_cgroup: Path = Path("/proc/self/cgroup")) -> list[Path]:  # fmt: skip
    """This process's cgroup directories (each v1 controller's, and the unified one), read
    only: where an agent run by this process makes its folder of task cgroups."""
    try:
        mounts_v1, mount_v2 = _mounts(mountinfo.read_text())
        own = _own_paths(self_cgroup.read_text())
    except OSError:
        return []
    dirs = [mount / own.get(c, "/").lstrip("/") for c, mount in mounts_v1.items()]
    if mount_v2 is not None and "" in own:
        dirs.append(mount_v2 / own[""].lstrip("/"))
    return _unique(d for d in dirs if d.is_dir())


def _mounts(text: str) -> tuple[dict[str, Path], Path | None]:
    """The v1 controllers' mount points and the v2 mount point, from /proc/self/mountinfo."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        parts, tail = before.split(), after.split()
        if len(parts) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2" and v2 is None:
            v2 = Path(parts[4])
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in V1_CONTROLLERS and option not in v1:
                    v1[option] = Path(parts[4])
    return v1, v2


def _own_paths(text: str) -> dict[str, str]:
    """Controller -> this process's cgroup path ("" for the unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def device_rules(paths: Iterable[str]) -> list[str]:
    """devices.allow lines for these device nodes (a missing one is skipped)."""
    rules = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        kind = "c" if stat.S_ISCHR(info.st_mode) else "b" if stat.S_ISBLK(info.st_mode) else ""
        if kind:
            rules.append(f"{kind} {os.major(info.st_rdev)}:{os.minor(info.st_rdev)} rwm")
    return rules


def gpu_device_nodes(indices: Iterable[int], nodes: dict[int, str]) -> tuple[str, ...]:
    """The device nodes of these GPUs plus the shared control nodes that exist."""
    own = [nodes[i] for i in indices if i in nodes]
    shared = [p for p in GPU_CONTROL_NODES if os.path.exists(p)] if own else []
    return tuple(own + shared)


# --- small file helpers ----------------------------------------------------------------


def _quota_us(millicores: int) -> int:
    return max(MIN_QUOTA_US, millicores * CFS_PERIOD_US // 1000)


def _wait_empty(group: TaskCgroup) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while group.pids() and time.monotonic() < deadline:
        time.sleep(0.01)


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: dict[Path, None] = {}
    for path in paths:
        seen.setdefault(path, None)
    return list(seen)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file ("key value" per line)."""
    result: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return result
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            result[parts[0]] = int(parts[1])
    return result


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True
