"""GPU sharing on the node (scheduler/agent/gpumodes.py, mps.py): the modes a node offers by
its flags, MIG instances found through NVML (a fake NVML here), the MPS control daemon per GPU
(a script that behaves as nvidia-cuda-mps-control does), and what a task holding a share finds
in its environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent import command
from scheduler.agent.client import Http
from scheduler.agent.fence import Fence
from scheduler.agent.gpumodes import mig_device_nodes
from scheduler.agent.gpus import FAKE_MEMORY
from scheduler.agent.mps import PID_FILE, thread_percentage
from scheduler.agent.runtime import discover_gpus
from scheduler.agent.sharemodes import ISOLATION
from scheduler.agent.sim import SimCluster, SimNode
from scheduler.agent.wire import GPU_SHARING_MODES
from tests.agent.test_runtime import RecordingAgent, agent_running, run_until

FAKE_CONTROL = Path(__file__).with_name("fake_mps_control.py")
GI = 2**30


@pytest.fixture
def control(tmp_path: Path) -> Iterator[str]:
    """A fake nvidia-cuda-mps-control; whatever daemons it left are killed after the test."""
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n{FAKE_CONTROL.read_text()}")
    path.chmod(0o755)
    yield str(path)
    for pid_file in tmp_path.glob(f"**/{PID_FILE}"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def sharing_agent(tmp_path: Path, **kw: Any) -> RecordingAgent:
    return RecordingAgent(tmp_path / "agent", fake_gpus=2, **kw)


def registered(agent: RecordingAgent) -> dict[str, Any]:
    agent.prepare()
    agent.register()
    return [body for path, body in agent.sent if path == "register/"][-1]


def control_log(agent: RecordingAgent, index: int) -> list[dict[str, Any]]:
    text = (agent.state_dir / "mps" / f"gpu{index}" / "control.log").read_text()
    return [json.loads(line) for line in text.splitlines()]


def env_of(agent: RecordingAgent, task_id: int) -> dict[str, str]:
    """The environment a task printed with `env`, as lines KEY=VALUE."""
    pairs = (line.partition("=") for line in agent.output(task_id).splitlines())
    return {key: value for key, _, value in pairs}


def run_task(agent: RecordingAgent, order: dict[str, Any]) -> dict[str, Any]:
    agent.answers = [{"start": [{"id": 1, "attempt": 0, "command": "env", **order}]}]
    run_until(agent, lambda: any(r["state"] != "Running" for r in agent.reports()))
    agent.step()
    return [r for r in agent.reports() if r["state"] != "Running"][-1]


# --- what a node offers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "offered"),
    [("auto", ["timeslice"]), ("none", []), ("timeslice", ["timeslice"]),
     ("mps,timeslice", ["mps", "timeslice"]), ("mig,timeslice", ["timeslice"])],
)  # fmt: skip
def test_fake_gpus_offer_the_modes_their_flags_allow(tmp_path, control, flag, offered):
    options = command.sharing_options({"gpu_sharing": flag, "mps_control": control})
    agent = sharing_agent(tmp_path, **options)
    body = registered(agent)
    # mig is asked for but fake GPUs have no MIG instances: left out, not claimed.
    assert body["gpu_sharing"] == offered
    agent.sharing.close(set())


def test_a_node_without_gpus_offers_no_sharing(tmp_path):
    agent = RecordingAgent(tmp_path, gpu_sharing=("timeslice",))
    assert registered(agent)["gpu_sharing"] == []


def test_bad_sharing_flags_are_refused_naming_the_flag(tmp_path):
    with pytest.raises(command.UsageError, match="--gpu-sharing: unknown mode 'shard'"):
        command.sharing_options({"gpu_sharing": "mps,shard"})
    with pytest.raises(command.UsageError, match="--mps-control: .* is not an executable"):
        command.sharing_options({"gpu_sharing": "mps", "mps_control": str(tmp_path / "nope")})
    empty = {"PATH": str(tmp_path), "BERTH_MPS_CONTROL": ""}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in empty.items():
            patch.setenv(key, value)
        patch.setattr("scheduler.agent.mps.TASK_PATH", str(tmp_path))
        with pytest.raises(command.UsageError, match="--gpu-sharing mps: no nvidia-cuda-mps"):
            command.sharing_options({"gpu_sharing": "mps"})


def test_every_mode_says_what_it_isolates():
    assert set(ISOLATION) == set(GPU_SHARING_MODES)
    assert ISOLATION["mig"]["memory"] == "isolated" and ISOLATION["mig"]["faults"] == "isolated"
    assert ISOLATION["mps"]["faults"] == "shared" and ISOLATION["mps"]["memory"] == "limited"
    assert ISOLATION["timeslice"]["memory"] == "none"
    assert ISOLATION["timeslice"]["faults"] == "shared"


# --- time-slicing -----------------------------------------------------------------------


def test_a_time_sliced_share_sees_its_gpu_and_its_share(tmp_path):
    agent = sharing_agent(tmp_path)  # fake GPUs: timeslice by default
    registered(agent)
    end = run_task(agent, {"devices": [1], "shares": [0.5], "env": {"CUDA_VISIBLE_DEVICES": "1"}})
    env = env_of(agent, 1)
    assert end["state"] == "Succeeded"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert (env["BERTH_GPU_SHARE"], env["BERTH_GPU_SHARING"]) == ("0.5", "timeslice")
    assert not [k for k in env if k.startswith("CUDA_MPS_")]


def test_a_whole_gpu_task_is_told_its_share_is_whole(tmp_path):
    agent = sharing_agent(tmp_path)
    registered(agent)
    run_task(agent, {"devices": [0, 1], "env": {"CUDA_VISIBLE_DEVICES": "0,1"}})
    env = env_of(agent, 1)
    assert env["BERTH_GPU_SHARE"] == "1,1" and "BERTH_GPU_SHARING" not in env


def test_a_node_that_offers_no_sharing_refuses_a_share(tmp_path):
    agent = sharing_agent(tmp_path, gpu_sharing=())
    registered(agent)
    end = run_task(agent, {"devices": [0], "shares": [0.25]})
    assert end["state"] == "Failed"
    assert "GPU 0 here is not shared: this node offers no GPU sharing" in end["message"]


def test_a_share_spanning_devices_or_out_of_range_is_refused(tmp_path):
    agent = sharing_agent(tmp_path)
    registered(agent)
    end = run_task(agent, {"devices": [0, 1], "shares": [0.5, 0.5]})
    assert "a share of a GPU must be the task's only GPU" in end["message"]
    agent = sharing_agent(tmp_path / "second")
    registered(agent)
    end = run_task(agent, {"devices": [0], "shares": [1.5]})
    assert "shares must be one number in (0, 1] per device" in end["message"]


# --- MPS --------------------------------------------------------------------------------


def test_it_starts_one_mps_daemon_per_gpu_with_that_gpu_alone(tmp_path, control, monkeypatch):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "secret-join-token")
    agent = sharing_agent(tmp_path, gpu_sharing=("mps",), mps_control=control)
    assert registered(agent)["gpu_sharing"] == ["mps"]
    for index in (0, 1):
        started = control_log(agent, index)[0]
        assert started["args"] == ["-d"]
        pipe = agent.work_dir / "mps" / f"gpu{index}"
        assert started["env"]["CUDA_VISIBLE_DEVICES"] == str(index)
        assert started["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        logs = agent.state_dir / "mps" / f"gpu{index}"  # in the agent's private state dir
        assert started["env"]["CUDA_MPS_LOG_DIRECTORY"] == str(logs)
        assert "BERTH_JOIN_TOKEN" not in started["env"]  # built from scratch
        assert agent.sharing.mps.pid(index) is not None
        assert pipe.stat().st_mode & 0o777 == 0o755  # tasks of other accounts reach it
    # Registering again (a restarted session) adopts the running daemons.
    registered(agent)
    assert [len(control_log(agent, i)) for i in (0, 1)] == [1, 1]
    agent.sharing.close(set())


def test_a_task_holding_an_mps_share_gets_its_limits(tmp_path, control):
    agent = sharing_agent(tmp_path, gpu_sharing=("mps", "timeslice"), mps_control=control)
    registered(agent)
    # The job's own env cannot raise its limits: the agent's values come last.
    job_env = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}
    order = {"devices": [1], "shares": [0.25], "gpu_memory": 2 * GI, "env": job_env}
    assert run_task(agent, order)["state"] == "Succeeded"
    env = env_of(agent, 1)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(agent.work_dir / "mps" / "gpu1")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert (env["BERTH_GPU_SHARE"], env["BERTH_GPU_SHARING"]) == ("0.25", "mps")
    assert env["BERTH_GPU_MEMORY"] == str(2 * GI)
    agent.sharing.close(set())


def test_an_mps_share_without_a_gpu_memory_request_gets_that_share_of_it(tmp_path, control):
    agent = sharing_agent(tmp_path, gpu_sharing=("mps",), mps_control=control)
    registered(agent)
    run_task(agent, {"devices": [0], "shares": [0.3]})
    env = env_of(agent, 1)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={int(0.3 * FAKE_MEMORY) // 2**20}M"
    agent.sharing.close(set())


def test_thread_percentages_round_up_and_stay_in_range():
    assert [thread_percentage(s) for s in (0.07, 0.25, 0.333, 0.001, 1.0)] == [7, 25, 34, 1, 100]


def test_a_dead_mps_daemon_is_started_again(tmp_path, control):
    agent = sharing_agent(tmp_path, gpu_sharing=("mps",), mps_control=control)
    registered(agent)
    first = agent.sharing.mps.pid(0)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    agent.sharing.mps.check_seconds = 0.0
    run_until(agent, lambda: agent.sharing.mps.pid(0) not in (None, first))
    assert [e["args"] for e in control_log(agent, 0) if "args" in e] == [["-d"], ["-d"]]
    assert len(control_log(agent, 1)) == 1  # the other GPU's daemon was left alone
    agent.sharing.close(set())


def test_the_agent_stops_its_mps_daemons_when_it_exits(tmp_path, control):
    agent = sharing_agent(tmp_path, gpu_sharing=("mps",), mps_control=control)
    with agent_running(agent, 30) as runner:
        run_until_true(lambda: all(agent.sharing.mps.pid(i) for i in (0, 1)) and agent.sent)
    assert not runner.is_alive()
    for index in (0, 1):
        assert agent.sharing.mps.pid(index) is None
        log = control_log(agent, index)
        assert [e["args"] for e in log if "args" in e] == [["-d"], []]  # the client: quit
        assert log[-1]["command"] == "quit"


def run_until_true(done: Any, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# --- MIG --------------------------------------------------------------------------------


class MigNvml(types.ModuleType):
    """What the agent reads of pynvml on a node with GPU 0 in MIG mode (a 1g.10gb instance,
    and a 3g.40gb GPU instance with a 1-slice compute instance in slot 2) and GPU 1 without.
    Any other NVML call is recorded and fails: the agent must never change MIG settings."""

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, root: bool = True) -> None:
        super().__init__("pynvml")
        self.root = root
        self.other: list[str] = []
        self.migs = {
            (0, 0): ("MIG-aaaa", 1, 0, 19, (1, 1, 9856), "MIG 1g.10gb", 10 * GI),
            (0, 2): ("MIG-bbbb", 2, 0, 9, (3, 1, 40192), "MIG 3g.40gb", 40 * GI),
        }

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            self.other.append(name)
            raise RuntimeError(f"{name} is not expected")
        raise AttributeError(name)

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:  # noqa: N802
        return self.migs[handle[1:]][0].encode() if handle[0] == "mig" else b"GPU-%d" % handle[1]

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        total = self.migs[handle[1:]][6] if handle[0] == "mig" else 80 * GI
        return types.SimpleNamespace(total=total, used=0)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:  # noqa: N802
        return [1, 1] if handle[1] == 0 else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:  # noqa: N802
        if (handle[1], slot) not in self.migs:
            raise RuntimeError("Not Found")
        return ("mig", handle[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:  # noqa: N802
        return self.migs[mig[1:]][1]

    def nvmlDeviceGetComputeInstanceId(self, mig: Any) -> int:  # noqa: N802
        return self.migs[mig[1:]][2]

    def nvmlDeviceGetAttributes(self, mig: Any) -> Any:  # noqa: N802
        gi, ci, megabytes = self.migs[mig[1:]][4]
        return types.SimpleNamespace(gpuInstanceSliceCount=gi, computeInstanceSliceCount=ci,
                                     memorySizeMB=megabytes)  # fmt: skip

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi: int) -> Any:  # noqa: N802
        if not self.root:
            raise RuntimeError("Insufficient Permissions")
        return ("gi", handle[1], gi)

    def nvmlGpuInstanceGetInfo(self, instance: Any) -> Any:  # noqa: N802
        profile = [m[3] for m in self.migs.values() if m[1] == instance[2]][0]
        return types.SimpleNamespace(id=instance[2], profileId=profile)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profile: int) -> Any:  # noqa: N802
        name = [m[5] for m in self.migs.values() if m[3] == profile][0]
        return types.SimpleNamespace(id=profile, name=name.encode())


@pytest.mark.parametrize("root", [True, False])
def test_it_finds_mig_instances_through_nvml_without_changing_them(monkeypatch, root):
    nvml = MigNvml(root)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    devices = discover_gpus(0, "n1")
    assert [d["uuid"] for d in devices] == ["GPU-0", "GPU-1"]
    # Without root NVML hides the GPU instance's profile: the name is made from its slices.
    assert devices[0]["mig"] == [
        {"profile": "1g.10gb", "uuid": "MIG-aaaa", "memory": 10 * GI, "gpu_instance": 1,
         "compute_instance": 0},
        {"profile": "1c.3g.40gb" if root else "1c.3g.39gb", "uuid": "MIG-bbbb",
         "memory": 40 * GI, "gpu_instance": 2, "compute_instance": 0},
    ]  # fmt: skip
    assert "mig" not in devices[1]
    assert nvml.other == []  # nothing but reads


def mig_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> RecordingAgent:
    monkeypatch.setitem(sys.modules, "pynvml", MigNvml())
    agent = RecordingAgent(tmp_path / "agent", **kw)
    agent.fence = RecordingFence(tmp_path)
    return agent


class RecordingFence(Fence):
    """A best-effort fence whose GPU 0 is /dev/nvidia0, recording each task's limits."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__("best-effort", base_name="berth-test-node",
                         gpu_nodes={0: "/dev/nvidia0", 1: "/dev/nvidia1"})  # fmt: skip
        self.made: list[Any] = []

    def create(self, name: str, limits: Any) -> str:
        self.made.append(limits)
        return super().create(name, limits)


def test_real_gpus_offer_their_mig_instances_and_no_more_by_default(tmp_path, monkeypatch):
    agent = mig_agent(tmp_path, monkeypatch)
    body = registered(agent)
    assert body["gpu_sharing"] == ["mig"]
    assert [m["profile"] for m in body["devices"][0]["mig"]] == ["1g.10gb", "1c.3g.40gb"]
    # A share of the GPU without MIG is refused: time-slicing real GPUs is the operator's call.
    end = run_task(agent, {"devices": [1], "shares": [0.5]})
    assert "GPU 1 here is not shared: this node offers mig" in end["message"]


def test_a_task_on_a_mig_instance_sees_only_it(tmp_path, monkeypatch):
    agent = mig_agent(tmp_path, monkeypatch)
    caps = tmp_path / "proc" / "gpu0" / "mig" / "gi2"
    (caps / "ci0").mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (caps / "ci0" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\n")
    (tmp_path / "dev").mkdir()
    for minor in (21, 22):
        (tmp_path / "dev" / f"nvidia-cap{minor}").touch()
    registered(agent)
    agent.sharing.caps = (tmp_path / "proc", tmp_path / "dev")
    order = {"devices": [0], "shares": [0.4], "mig": ["MIG-bbbb"],
             "env": {"CUDA_VISIBLE_DEVICES": "0"}}  # fmt: skip
    assert run_task(agent, order)["state"] == "Succeeded"
    env = env_of(agent, 1)
    assert (env["CUDA_VISIBLE_DEVICES"], env["BERTH_GPU_SHARING"]) == ("MIG-bbbb", "mig")
    # Its cgroup may open its GPU's device node and its instance's two capabilities.
    assert isinstance(agent.fence, RecordingFence)
    assert agent.fence.made[-1].devices[0] == "/dev/nvidia0"
    assert agent.fence.made[-1].devices[-2:] == (
        str(tmp_path / "dev" / "nvidia-cap21"), str(tmp_path / "dev" / "nvidia-cap22"))  # fmt: skip


def test_a_mig_instance_the_gpu_does_not_have_is_refused(tmp_path, monkeypatch):
    agent = mig_agent(tmp_path, monkeypatch)
    registered(agent)
    end = run_task(agent, {"devices": [1], "mig": ["MIG-aaaa"]})
    assert end["state"] == "Failed" and "GPU 1 here has no MIG instance MIG-aaaa" in end["message"]


def test_mig_capabilities_are_read_from_the_drivers_proc_files(tmp_path):
    assert mig_device_nodes("/dev/nvidia3", 1, 0, tmp_path / "proc", tmp_path / "dev") == ()


class RecordingCluster(SimCluster):
    def __init__(self, gpus: int) -> None:
        super().__init__("http://127.0.0.1:1", "join", nodes=0, gpus=gpus, cpu=1, memory=1)
        self.bodies: list[dict[str, Any]] = []

    def _post(self, node: SimNode, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        self.bodies.append(body)
        return {"token": "t", "lease_seconds": 10}


@pytest.mark.parametrize(("gpus", "offered"), [(2, ["timeslice"]), (0, [])])
def test_simulated_nodes_offer_time_slicing_of_their_fake_gpus(gpus, offered):
    cluster = RecordingCluster(gpus)
    cluster.register(SimNode("sim-0000", 1000, 2**30, gpus, {}, Http("http://127.0.0.1:1")))
    assert cluster.bodies[0]["gpu_sharing"] == offered


def test_the_docs_state_the_isolation_the_agent_holds():
    text = (Path(__file__).parents[2] / "docs" / "gpus.md").read_text()
    section = text[text.index("## Sharing modes and their isolation") :].split("\n### ")[0]
    rows = {cells[0].strip("` "): [c.strip() for c in cells[1:4]]
            for line in section.splitlines() if line.startswith("| `")
            for cells in [line.strip("|").split("|")]}  # fmt: skip
    for mode, isolation in ISOLATION.items():
        assert rows[mode] == [isolation["memory"], isolation["faults"], isolation["compute"]]


def test_on_real_gpus_a_task_holding_whole_gpus_names_them_by_uuid(tmp_path, monkeypatch):
    """Fenced, a task's CUDA counts only the GPUs it may open, from 0: the server's node
    indices ("1") would name no GPU for a task holding GPU 1. UUIDs name the right ones."""
    agent = mig_agent(tmp_path, monkeypatch)
    registered(agent)
    assert run_task(agent, {"devices": [1], "env": {"CUDA_VISIBLE_DEVICES": "1"}})["state"] == (
        "Succeeded"
    )
    env = env_of(agent, 1)
    assert (env["CUDA_VISIBLE_DEVICES"], env["BERTH_GPU_SHARE"]) == ("GPU-1", "1")


def test_a_node_whose_mps_daemon_cannot_start_does_not_claim_mps(tmp_path):
    broken = tmp_path / "bin" / "nvidia-cuda-mps-control"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'cannot open the GPU' >&2\nexit 1\n")
    broken.chmod(0o755)
    agent = sharing_agent(tmp_path, gpu_sharing=("mps", "timeslice"), mps_control=str(broken))
    assert registered(agent)["gpu_sharing"] == ["timeslice"]
    assert agent.sharing.mps.devices == {}  # nothing left to watch or restart


def test_an_mps_daemon_a_running_task_uses_outlives_the_agent(tmp_path, control):
    agent = sharing_agent(tmp_path, gpu_sharing=("mps",), mps_control=control)
    agent.answers = [{"start": [{"id": 1, "attempt": 0, "command": "sleep 30", "devices": [1],
                                 "shares": [0.5]}]}]  # fmt: skip
    with agent_running(agent, 30):
        run_until_true(lambda: 1 in agent.tasks and agent.tasks[1].state == "Running")
    # The task goes on after the agent (no --kill-on-exit): its GPU's daemon stays for it.
    assert agent.tasks[1].gpu_mode == "mps"
    assert agent.sharing.mps.pid(0) is None and agent.sharing.mps.pid(1) is not None
    os.killpg(agent.tasks[1].pid, signal.SIGKILL)


def test_on_real_gpus_mps_names_the_gpu_by_uuid_and_leaves_mig_gpus_alone(
    tmp_path, monkeypatch, control
):
    agent = mig_agent(tmp_path, monkeypatch, gpu_sharing=("mig", "mps"), mps_control=control)
    assert registered(agent)["gpu_sharing"] == ["mig", "mps"]
    assert sorted(agent.sharing.mps.devices) == [1]  # GPU 0 is in MIG mode: no daemon
    assert control_log(agent, 1)[0]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    order = {"devices": [1], "shares": [0.5], "env": {"CUDA_VISIBLE_DEVICES": "1"}}
    assert run_task(agent, order)["state"] == "Succeeded"
    env = env_of(agent, 1)
    # The MPS server renumbers what it sees: the UUID names the same GPU for the client.
    assert (env["CUDA_VISIBLE_DEVICES"], env["BERTH_GPU_SHARING"]) == ("GPU-1", "mps")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={40 * 1024}M"  # half of 80 GiB
    agent.sharing.close(set())


# --- bench/gpu_device_check.py ------------------------------------------------------------

CHECK = Path(__file__).parents[2] / "bench" / "gpu_device_check.py"
NO_NVML = """
class NVMLError(Exception):
    pass
def nvmlInit():
    raise NVMLError("NVML Shared Library Not Found")
"""
ONE_GPU = """
NVML_DEVICE_MIG_ENABLE = 1
class _Memory:
    total = 80 * 2**30
    used = 2**30
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "580.00"
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetUUID(handle): return "GPU-check"
def nvmlDeviceGetName(handle): return b"NVIDIA H100 80GB HBM3"
def nvmlDeviceGetMemoryInfo(handle): return _Memory()
def nvmlDeviceGetMigMode(handle): return [0, 0]
def nvmlDeviceGetComputeMode(handle): return 0
def nvmlDeviceGetMinorNumber(handle): return 0
class _Rates:
    gpu = 7
def nvmlDeviceGetUtilizationRates(handle): return _Rates()
def nvmlDeviceGetComputeRunningProcesses(handle): return []
"""


def device_check(tmp_path: Path, nvml: str, *args: str) -> dict[str, Any]:
    fake = tmp_path / "fake-nvml"
    fake.mkdir(exist_ok=True)
    (fake / "pynvml.py").write_text(nvml)
    env = {**os.environ, "PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(CHECK), *args], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_device_check_says_no_gpu_where_there_is_none(tmp_path):
    report = device_check(tmp_path, NO_NVML)
    assert report["gpu"] is False and report["reason"].startswith("no GPU: NVML is not available")


def test_the_device_check_runs_the_agents_mps_daemon_and_two_clients(tmp_path, control):
    report = device_check(tmp_path, ONE_GPU, "--mps-control", control, "--clients", "50,25")
    assert report["gpu"] is True
    assert report["devices"][0]["uuid"] == "GPU-check" and report["devices"][0]["mig"] == []
    mps = report["mps"]
    assert (mps["daemon_started"], mps["daemon_stopped"]) == (True, True)
    percentages = [c["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for c in mps["clients"]]
    assert percentages == ["50", "25"]
    assert json.loads(mps["control_log"][-1])["command"] == "quit"
    assert report["minor_numbers"] == {"0": 0}
    held = report["sampler"]["while_held"]
    assert held == [{"index": 0, "utilization": 7, "memory_used": GI, "memory_total": 80 * GI}]
    assert "nodes" in report["fence"] and "describe" in report["agent_fence"]


# --- fake MIG instances (--fake-mig) ----------------------------------------------------


def test_fake_mig_instances_are_registered_and_offered_beside_time_slicing(tmp_path):
    options = command.sharing_options({"fake_gpus": 2, "fake_mig": ["0:1g.10gb,2G.20gb"]})
    agent = sharing_agent(tmp_path, **options)
    body = registered(agent)
    assert body["gpu_sharing"] == ["mig", "timeslice"]
    mig = body["devices"][0]["mig"]
    assert [(m["profile"], m["memory"]) for m in mig] == [
        ("1g.10gb", 10 * GI),
        ("2g.20gb", 20 * GI),
    ]
    assert len({m["uuid"] for m in mig}) == 2 and "mig" not in body["devices"][1]


def test_a_task_on_a_fake_mig_instance_sees_its_uuid(tmp_path):
    agent = sharing_agent(tmp_path, fake_mig={1: ["1g.10gb"]})
    uuid = registered(agent)["devices"][1]["mig"][0]["uuid"]
    end = run_task(agent, {"devices": [1], "shares": [0.142], "mig": [uuid]})
    assert end["state"] == "Succeeded", end
    env = env_of(agent, 1)
    assert (env["CUDA_VISIBLE_DEVICES"], env["BERTH_GPU_SHARING"]) == (uuid, "mig")


@pytest.mark.parametrize(
    ("flags", "error"),
    [(["1g.10gb"], "expected GPU:PROFILES"), (["2:1g.10gb"], "GPU 2 is not one of the 2"),
     (["0:1g.10gb,big"], "'big' is not a MIG profile")],
)  # fmt: skip
def test_bad_fake_mig_flags_are_refused_naming_the_flag(flags, error):
    with pytest.raises(command.UsageError, match=f"--fake-mig: {error}"):
        command.sharing_options({"fake_gpus": 2, "fake_mig": flags})
