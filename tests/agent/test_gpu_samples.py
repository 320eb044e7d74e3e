"""Agent side of GPU utilisation: the samples the real and simulated agents put in their
lease renewals (scheduler/agent/gpus.py), from fake GPUs and from NVML."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from scheduler.agent.client import Http
from scheduler.agent.gpus import FAKE_BUSY_UTILIZATION, FAKE_MEMORY, GpuSampler
from scheduler.agent.runtime import Agent, RunningTask, discover_gpus
from scheduler.agent.sim import SimCluster, SimNode

GI = 2**30


def test_it_reports_fake_gpus_busy_only_while_a_task_holds_them() -> None:
    devices = discover_gpus(3, "n1")
    sampler = GpuSampler(devices, fake=True)
    first = sampler.sample(busy={1})
    assert [s["index"] for s in first] == [0, 1, 2]
    assert first[0] == {"index": 0, "utilization": 0, "memory_used": 0,
                        "memory_total": FAKE_MEMORY}  # fmt: skip
    assert first[1]["utilization"] == FAKE_BUSY_UTILIZATION[(1 + 1) % len(FAKE_BUSY_UTILIZATION)]
    assert first[1]["memory_used"] == FAKE_MEMORY * 3 // 4
    assert first[2]["utilization"] == 0
    # The next sample moves a busy GPU along its pattern; once free it is idle again.
    second = sampler.sample(busy={1})
    assert second[1]["utilization"] == FAKE_BUSY_UTILIZATION[(2 + 1) % len(FAKE_BUSY_UTILIZATION)]
    assert all(s["utilization"] == 0 and s["memory_used"] == 0 for s in sampler.sample(busy=()))


def test_a_machine_without_gpus_sends_no_samples() -> None:
    assert GpuSampler([], fake=True).sample(busy={0}) == []


class FakeNvml(types.ModuleType):
    """What the agent calls of pynvml, with one device that NVML cannot read."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.calls: list[str] = []

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.calls.append("init")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index == 2:
            raise RuntimeError("GPU is lost")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return types.SimpleNamespace(gpu=[37, 140][handle], memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return types.SimpleNamespace(total=80 * GI, used=[3 * GI, 81 * GI][handle])


def test_it_reads_real_gpus_through_nvml_and_keeps_values_in_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    devices = [{"index": i, "model": "H100", "memory": 80 * GI} for i in range(3)]
    sampler = GpuSampler(devices, fake=False)
    samples = sampler.sample(busy=())
    # Device 2 cannot be read: left out, the others still reported; odd readings clamped.
    assert samples == [
        {"index": 0, "utilization": 37, "memory_used": 3 * GI, "memory_total": 80 * GI},
        {"index": 1, "utilization": 100, "memory_used": 80 * GI, "memory_total": 80 * GI},
    ]
    sampler.sample(busy=())
    sampler.close()
    assert nvml.calls == ["init", "shutdown"]  # initialised once, not per sample


def test_the_agents_lease_carries_its_gpus_samples(tmp_path: Any) -> None:
    agent = Agent("http://127.0.0.1:1", "join", name="n1", fake_gpus=2, work_dir=tmp_path)
    agent.gpus = GpuSampler(discover_gpus(2, "n1"), fake=True)  # as register() sets it
    agent.tasks[7] = RunningTask(7, 0, 0, str(tmp_path / "t7"), devices=[1])
    agent.tasks[8] = RunningTask(8, 0, 0, str(tmp_path / "t8"), devices=[0], state="Succeeded")
    body = agent.lease_body()
    # Task 8 has ended: only the running task's GPU is busy.
    assert [(g["index"], g["utilization"] > 0) for g in body["usage"]["gpus"]] == [
        (0, False), (1, True)]  # fmt: skip
    assert [t["id"] for t in body["tasks"]] == [7, 8]


def test_the_simulated_node_fakes_busy_gpus_for_its_running_tasks() -> None:
    node = SimNode("sim-0000", 8000, 2**34, 4, {}, Http("http://127.0.0.1:1"))
    assert all(s["utilization"] == 0 for s in node.gpu_samples())
    # A start order names the devices, as the server's does.
    cluster = SimCluster("http://127.0.0.1:1", "join", nodes=0, gpus=4, cpu=1, memory=1)
    cluster.apply_orders(node, {"start": [{"id": 5, "attempt": 0, "devices": [2, 3],
                                           "env": {"BERTH_SIM_DURATION": "60"}}]})  # fmt: skip
    samples = node.gpu_samples()
    assert [s["index"] for s in samples if s["utilization"] > 0] == [2, 3]
    assert [s["memory_used"] > 0 for s in samples] == [False, False, True, True]
