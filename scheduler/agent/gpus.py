"""Per-GPU utilisation samples for the agent's lease renewals (Django-free).

A sample is `{"index", "utilization" (0-100 %), "memory_used" (bytes), "memory_total"}`
(docs/agents.md). Real GPUs are read through NVML; fake GPUs (`--fake-gpus`, the simulated
agent) get made-up values that follow what the agent runs: a device held by a running task is
busy, any other is idle. The fake values are a function of the device, whether it is busy and
a tick counter, so tests can say exactly what to expect. A task may fix what its fake GPUs
report with `BERTH_FAKE_GPU_UTILIZATION` (0-100) in its env, e.g. 0 for a job that holds its
GPUs idle (docs/agents.md); real GPUs ignore it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("berth.agent")
FAKE_MEMORY = 16 * 2**30  # what a fake GPU says it has (bytes)
# A busy fake GPU's utilisation walks through these, one step per sample, shifted by index.
FAKE_BUSY_UTILIZATION = (92, 97, 88, 95, 99, 90, 94, 86)
FAKE_BUSY_MEMORY_SHARE = 0.75  # of its memory, while a task holds it
# A task's env may fix its fake GPUs' utilisation (percent), e.g. 0: held but idle.
FAKE_LEVEL_ENV = "BERTH_FAKE_GPU_UTILIZATION"


def fake_level(env: object) -> int | None:
    """The fake utilisation a start order's env asks for (FAKE_LEVEL_ENV), or None: a whole
    number from 0 to 100, anything else ignored."""
    raw = env.get(FAKE_LEVEL_ENV) if isinstance(env, dict) else None
    try:
        level = int(str(raw).strip()) if raw is not None else None
    except ValueError:
        return None
    return level if level is not None and 0 <= level <= 100 else None


def fake_sample(
    index: int, busy: bool, tick: int, memory_total: int = FAKE_MEMORY, level: int | None = None
) -> dict[str, int]:
    """One fake GPU's sample: idle (0 %, no memory used) or busy (86-99 %, or `level` when
    its task fixed one; 3/4 of its memory)."""
    total = memory_total or FAKE_MEMORY
    if not busy:
        return {"index": index, "utilization": 0, "memory_used": 0, "memory_total": total}
    pattern = FAKE_BUSY_UTILIZATION
    return {
        "index": index,
        "utilization": pattern[(tick + index) % len(pattern)] if level is None else level,
        "memory_used": int(total * FAKE_BUSY_MEMORY_SHARE),
        "memory_total": total,
    }


def fake_samples(
    indices: Iterable[int], busy: Iterable[int], tick: int,
    levels: Mapping[int, int] | None = None,
) -> list[dict[str, int]]:  # fmt: skip
    held, fixed = set(busy), levels or {}
    return [fake_sample(i, i in held, tick, level=fixed.get(i)) for i in sorted(set(indices))]


def task_utilization(devices: Iterable[int], samples: list[dict[str, int]]) -> float | None:
    """The mean utilisation of a task's GPUs in `samples` (None when none was sampled)."""
    utilization = {s["index"]: s["utilization"] for s in samples if "utilization" in s}
    mine = [utilization[i] for i in devices if i in utilization]
    return sum(mine) / len(mine) if mine else None


class GpuSampler:
    """Samples this machine's GPUs (`devices` as registered): through NVML, or fake ones.

    NVML stays initialised between samples (an init costs tens of milliseconds). A device NVML
    cannot read is left out of that sample; if NVML fails as a whole the sampler falls back to
    sending nothing rather than made-up numbers for real hardware.
    """

    def __init__(self, devices: list[dict[str, Any]], fake: bool) -> None:
        self.indices = sorted(int(d["index"]) for d in devices)
        self.fake = fake
        self.memory = {int(d["index"]): int(d.get("memory") or 0) for d in devices}
        self.tick = 0
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._broken = False

    def sample(
        self, busy: Iterable[int], levels: Mapping[int, int] | None = None
    ) -> list[dict[str, int]]:
        """One sample per device; `busy` are the indices that running tasks hold, `levels`
        what some of them fix for their fake GPUs (FAKE_LEVEL_ENV; real GPUs ignore it)."""
        self.tick += 1
        if not self.indices:
            return []
        if self.fake:
            held, fixed = set(busy), levels or {}
            return [fake_sample(i, i in held, self.tick, self.memory.get(i, 0), fixed.get(i))
                    for i in self.indices]  # fmt: skip
        return self._nvml_samples()

    def _nvml_samples(self) -> list[dict[str, int]]:
        if self._broken:
            return []
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            out = []
            for index in self.indices:
                try:
                    out.append(self._read(index))
                except Exception:  # one device off the bus must not hide the others
                    self._handles.pop(index, None)
            return out
        except Exception:
            log.warning("NVML unavailable: GPU utilisation is not reported", exc_info=True)
            self._broken = True
            return []

    def _read(self, index: int) -> dict[str, int]:
        nvml = self._nvml
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        total = max(int(memory.total), 0)
        return {
            "index": index,
            "utilization": min(max(int(rates.gpu), 0), 100),
            "memory_used": min(max(int(memory.used), 0), total) if total else 0,
            "memory_total": total,
        }

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
            self._handles = {}
