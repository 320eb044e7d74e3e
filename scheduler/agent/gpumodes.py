"""How this node shares its GPUs, and what each way really isolates (Django-free).

Three modes (wire.GPU_SHARING_MODES), each with the isolation it gives written once in
ISOLATION (agent/sharemodes.py), for the docs, the pages and `berth show` alike:

- `mig`: the GPU is cut into hardware instances by its administrator (never by Berth); the
  agent finds them through NVML (`mig_instances`) and a task placed on one sees only it.
- `mps`: NVIDIA's Multi-Process Service; the agent runs one control daemon per GPU
  (agent/mps.py) and gives each task its thread percentage and pinned memory limit.
- `timeslice`: tasks share the GPU as the driver interleaves them, with nothing between them.

`--gpu-sharing` chooses what the node offers (`parse_sharing`, `NodeSharing.configure`); a task
holding a share learns it from BERTH_GPU_SHARE (every mode) and BERTH_GPU_SHARING (the mode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.agent.mps import MpsDaemons
from scheduler.agent.sharemodes import MIG, MPS, TIMESLICE, mode_of
from scheduler.agent.wire import GPU_SHARING_MODES
from scheduler.core.quantity import MIG_PROFILE_RE

log = logging.getLogger("berth.agent")
AUTO, NONE = "auto", "none"
SHARE_ENV = "BERTH_GPU_SHARE"  # the task's share of each of its GPUs, e.g. "0.25" or "1,1"
MODE_ENV = "BERTH_GPU_SHARING"  # the mode a task holding a share runs under
MEMORY_ENV = "BERTH_GPU_MEMORY"  # the GPU memory (bytes) its job asked for, if any
CAPS_PROC = Path("/proc/driver/nvidia/capabilities")
CAPS_DEV = Path("/dev/nvidia-caps")


def parse_sharing(text: str) -> tuple[str, ...] | None:
    """`--gpu-sharing`: "auto" (None: the default for the node's GPUs), "none", or modes
    separated by commas. ValueError names what is wrong."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words in ([AUTO], []):
        return None
    if words == [NONE]:
        return ()
    unknown = [w for w in words if w not in GPU_SHARING_MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}: use auto, none, or some of"
                         f" {', '.join(GPU_SHARING_MODES)}")  # fmt: skip
    return tuple(m for m in GPU_SHARING_MODES if m in words)


def parse_fake_mig(values: list[str], fake_gpus: int) -> dict[int, list[str]]:
    """`--fake-mig GPU:PROFILES` flags -> fake GPU index -> its MIG instances' profiles.
    ValueError names what is wrong."""
    found: dict[int, list[str]] = {}
    for value in values:
        index, sep, profiles = value.partition(":")
        if not sep or not index.strip().isdigit():
            raise ValueError(f"expected GPU:PROFILES such as 0:1g.10gb,2g.20gb, got {value!r}")
        gpu = int(index)
        if gpu >= fake_gpus:
            raise ValueError(f"GPU {gpu} is not one of the {fake_gpus} fake GPUs (--fake-gpus)")
        names = [p.strip().lower() for p in profiles.split(",") if p.strip()]
        bad = [p for p in names if not MIG_PROFILE_RE.match(p)]
        if bad or not names:
            raise ValueError(f"{bad[0] if bad else value!r} is not a MIG profile such as 1g.10gb")
        found.setdefault(gpu, []).extend(names)
    return found


def fake_mig_instances(node: str, index: int, profiles: list[str]) -> list[dict[str, Any]]:
    """Made-up MIG instances of a fake GPU, as `mig_instances` reads real ones."""
    return [
        {
            "profile": profile,
            "uuid": f"MIG-fake-{node}-{index}-{k}",
            "memory": int(profile.split("g.")[1].split("gb")[0]) * 2**30,
            "gpu_instance": k + 1,
            "compute_instance": 0,
        }
        for k, profile in enumerate(profiles)
    ]


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def mig_instances(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """The MIG instances of one GPU, read through NVML ([] when MIG is off or unsupported).
    Only reads: MIG settings are the administrator's."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # not a MIG-capable GPU, or a driver without MIG
        return []
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception:  # an empty slot
            continue
        try:
            found.append(_mig_entry(nvml, handle, mig))
        except Exception:  # one unreadable instance must not hide the others
            log.warning("MIG slot %s of a GPU could not be read", slot, exc_info=True)
    return found


def _mig_entry(nvml: Any, parent: Any, mig: Any) -> dict[str, Any]:
    gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    return {
        "profile": _profile(nvml, parent, mig, gpu_instance),
        "uuid": _text(nvml.nvmlDeviceGetUUID(mig)),
        "memory": int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
        "gpu_instance": gpu_instance,
        "compute_instance": int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
    }


def _profile(nvml: Any, parent: Any, mig: Any, gpu_instance: int) -> str:
    """The instance's profile name as nvidia-smi writes it ("1g.10gb"; "1c.3g.40gb" for a
    compute instance smaller than its GPU instance): the GPU instance profile's own name, or
    one made from its slices and memory where NVML does not say (it may need root)."""
    attrs = nvml.nvmlDeviceGetAttributes(mig)
    try:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance))
        name = _text(nvml.nvmlDeviceGetGpuInstanceProfileInfoById(parent, info.profileId).name)
    except Exception:
        name = ""
    name = name.removeprefix("MIG").strip()
    if not name:
        name = f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
    if 0 < attrs.computeInstanceSliceCount < attrs.gpuInstanceSliceCount:
        name = f"{attrs.computeInstanceSliceCount}c.{name}"
    return name


def mig_device_nodes(gpu_node: str, gpu_instance: int, compute_instance: int,
                     proc: Path = CAPS_PROC, dev: Path = CAPS_DEV) -> tuple[str, ...]:  # fmt: skip
    """The capability device nodes a task on this MIG instance opens besides its GPU's
    /dev/nvidiaN (`gpu_node`): the driver names their minors under /proc (when the caps are
    device files; none when the driver uses /proc for them)."""
    minor = Path(gpu_node).name.removeprefix("nvidia")
    base = proc / f"gpu{minor}" / "mig" / f"gi{gpu_instance}"
    nodes = []
    for access in (base / "access", base / f"ci{compute_instance}" / "access"):
        try:
            lines = access.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(":")
            node = dev / f"nvidia-cap{value.strip()}"
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit() and node.exists():
                nodes.append(str(node))
    return tuple(nodes)


@dataclass
class TaskGpus:
    """What a task's GPUs add to its start: variables, and device nodes it may open."""

    env: dict[str, str]
    mode: str = ""  # the sharing mode ("" for whole GPUs)
    device_nodes: tuple[str, ...] = ()


class NodeSharing:
    """The modes this node offers and what a task holding a share gets.

    `requested`: the --gpu-sharing choice (None: auto). Auto offers what needs no trust in
    the tasks: MIG instances the administrator made, and plain time-slicing on fake GPUs
    (there is nothing to protect); on real GPUs MPS and time-slicing are offered only when
    the operator names them, since neither keeps one task's fault or memory from the others.
    """

    def __init__(self, requested: tuple[str, ...] | None, control: str | None,
                 pipe_base: Path, log_base: Path) -> None:  # fmt: skip
        self.requested = requested
        self.control = control
        self.mps = MpsDaemons(control or "", pipe_base, log_base)
        self.modes: list[str] = []
        self.devices: dict[int, dict[str, Any]] = {}
        self.fake = False
        self.caps = (CAPS_PROC, CAPS_DEV)  # where MIG capabilities are found (tests move it)

    def configure(self, devices: list[dict[str, Any]]) -> list[str]:
        """The modes offered for these discovered GPUs (start the MPS daemons if MPS is one);
        a requested mode the node cannot give is left out with a warning."""
        self.devices = {int(d["index"]): d for d in devices}
        self.fake = bool(devices) and all(d.get("model") == "fake" for d in devices)
        has_mig = any(d.get("mig") for d in devices)
        possible = {
            MIG: "" if has_mig else "no GPU here has MIG instances (made with nvidia-smi mig)",
            MPS: "" if self.control else "no nvidia-cuda-mps-control (--mps-control)",
            TIMESLICE: "",
        }
        if not devices:
            wanted: tuple[str, ...] = ()
        elif self.requested is None:
            fake = (MIG, TIMESLICE) if has_mig else (TIMESLICE,)
            wanted = fake if self.fake else (MIG,) if has_mig else ()
        else:
            wanted = self.requested
        for mode in wanted:
            if devices and possible[mode]:
                log.warning("--gpu-sharing %s: not offered: %s", mode, possible[mode])
        self.modes = [m for m in wanted if not possible[m]]
        served = {i: self._cuda_name(i) for i, d in self.devices.items() if not d.get("mig")}
        self.mps.ensure(served if MPS in self.modes else {})
        down = [i for i in self.mps.devices if self.mps.pid(i) is None]
        if down:  # the node claims MPS only where it can give it: on every GPU it shares
            log.error("--gpu-sharing mps: not offered: the MPS control daemon of GPU %s did not"
                      " start (its log is in %s)", down[0], self.mps.log_dir(down[0]))  # fmt: skip
            self.modes.remove(MPS)
            self.mps.ensure({})
        return list(self.modes)

    def _cuda_name(self, index: int) -> str:
        """How CUDA_VISIBLE_DEVICES names a GPU: its UUID (unambiguous, also under MPS), or
        its index for a fake GPU (or one this node did not register)."""
        return str(index) if self.fake else str(self.devices.get(index, {}).get("uuid") or index)

    def check(self) -> list[int]:
        """Start again any MPS daemon that died (the indices restarted)."""
        return self.mps.check() if MPS in self.modes else []

    def close(self, in_use: set[int]) -> None:
        self.mps.stop_all(in_use)

    def task(self, order: dict[str, Any], devices: list[int],
             gpu_nodes: dict[int, str]) -> TaskGpus:  # fmt: skip
        """What a start order's GPUs give its task; ValueError (the task fails to start,
        saying why) when the node cannot give it what the order says."""
        if not devices:
            return TaskGpus({})
        shares, migs = _shares(order, devices), _migs(order, devices)
        env = {SHARE_ENV: ",".join(f"{s:g}" for s in shares)}
        memory = order.get("gpu_memory")
        memory = memory if isinstance(memory, int) and not isinstance(memory, bool) else 0
        if memory > 0:
            env[MEMORY_ENV] = str(memory)
        if any(migs):
            return self._on_mig(env, devices, migs, gpu_nodes)
        if min(shares) >= 1:
            # Whole GPUs, named by UUID: where the task's device cgroup hides the node's
            # other GPUs, CUDA numbers those the task may open from 0, so the node's index of
            # any GPU but the first would name none there (seen on an H100: a GPU it may not
            # open is not counted; Slurm renumbers from 0 for the same reason). A UUID names
            # the same GPU fenced or not. Fake GPUs keep their indices.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._cuda_name(i) for i in devices)
            return TaskGpus(env)
        if len(devices) > 1:
            raise ValueError("a share of a GPU must be the task's only GPU")
        return self._shared(env, devices[0], shares[0], memory)

    def _on_mig(self, env: dict[str, str], devices: list[int], migs: list[str],
                gpu_nodes: dict[int, str]) -> TaskGpus:  # fmt: skip
        if MIG not in self.modes:
            raise ValueError("this node does not offer MIG instances (--gpu-sharing)")
        if len(devices) > 1:
            raise ValueError("a MIG instance must be the task's only GPU (CUDA uses one)")
        index, uuid = devices[0], migs[0]
        found = [m for m in self.devices.get(index, {}).get("mig") or [] if m["uuid"] == uuid]
        if not found:
            raise ValueError(f"GPU {index} here has no MIG instance {uuid}")
        instance = found[0]
        nodes: tuple[str, ...] = ()
        if index in gpu_nodes:  # its GPU's /dev/nvidiaN is allowed as any GPU's is
            nodes = mig_device_nodes(gpu_nodes[index], instance["gpu_instance"],
                                     instance["compute_instance"], *self.caps)  # fmt: skip
        env.update({"CUDA_VISIBLE_DEVICES": uuid, MODE_ENV: MIG})
        return TaskGpus(env, MIG, nodes)

    def _shared(self, env: dict[str, str], index: int, share: float, memory: int) -> TaskGpus:
        mode = mode_of(share, "", self.modes)  # (the rule the server names modes by)
        if not mode or self.devices.get(index, {}).get("mig"):
            offered = ", ".join(self.modes) or "no GPU sharing"
            raise ValueError(f"GPU {index} here is not shared: this node offers {offered}"
                             " (--gpu-sharing)")  # fmt: skip
        env[MODE_ENV] = mode
        if mode == TIMESLICE:
            return TaskGpus(env, mode)
        if self.mps.pid(index) is None and not self.mps.start(index):
            raise ValueError(f"the MPS control daemon of GPU {index} is not running")
        size = int(self.devices.get(index, {}).get("memory") or 0)
        env.update(self.mps.client_env(index, share, memory or int(share * size)))
        env["CUDA_VISIBLE_DEVICES"] = self._cuda_name(index)
        return TaskGpus(env, mode)


def _shares(order: dict[str, Any], devices: list[int]) -> list[float]:
    raw = order.get("shares")
    if not raw:
        return [1.0] * len(devices)
    good = isinstance(raw, list) and len(raw) == len(devices)
    if not good or not all(_share(s) for s in raw):
        raise ValueError("the start order's shares must be one number in (0, 1] per device")
    return [float(s) for s in raw]


def _share(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


def _migs(order: dict[str, Any], devices: list[int]) -> list[str]:
    raw = order.get("mig")
    if not raw:
        return [""] * len(devices)
    if not isinstance(raw, list) or len(raw) != len(devices):
        raise ValueError("the start order's mig must name one MIG UUID (or none) per device")
    if not all(isinstance(u, str) for u in raw):
        raise ValueError("the start order's mig must name one MIG UUID (or none) per device")
    return list(raw)
