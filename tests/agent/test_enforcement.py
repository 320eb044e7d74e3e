"""A task gets what it asked for and nothing more, and nothing of it outlives it: real agents,
as root, on this machine's cgroups (v1 here; v2 is tested against a fake tree in
test_cgroups.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.fence import Fence
from tests.agent.test_runtime import RecordingAgent, agent_running, run_until, start_order

pytestmark = pytest.mark.root
MiB = 2**20
ALLOCATE = "python3 -c \"x = b'x' * (1536 << 20); print('allocated')\""


def order(task_id: int, command: str, memory: int = 512 * MiB, cpu: int = 1000,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {**start_order(task_id, command), "resources": {"memory": memory, "cpu": cpu},
            **extra}  # fmt: skip


def ended(agent: RecordingAgent, task_id: int) -> dict[str, Any]:
    run_until(agent, lambda: _final(agent, task_id) is not None, timeout=30)
    final = _final(agent, task_id)
    assert final is not None
    return final


def _final(agent: RecordingAgent, task_id: int) -> dict[str, Any] | None:
    return next((r for r in agent.reports() if r["id"] == task_id and r["state"] != "Running"),
                None)  # fmt: skip


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def test_a_job_past_its_memory_ends_out_of_memory_and_its_neighbour_succeeds(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [order(1, ALLOCATE, memory=256 * MiB),
                                order(2, "sleep 1; echo fine", memory=256 * MiB)]}]  # fmt: skip
    hog, neighbour = ended(agent, 1), ended(agent, 2)
    assert (hog["state"], hog["reason"]) == ("Failed", "OutOfMemory")
    assert "memory limit 256Mi" in hog["message"] and "peak" in hog["message"]
    # bash may report the kill with the command's text (print('allocated')): only a line of
    # the program's own output counts
    assert "allocated" not in agent.output(1).splitlines()
    assert neighbour["state"] == "Succeeded" and agent.output(2) == "fine\n"


def test_a_half_cpu_job_spinning_two_loops_gets_half_a_core(tmp_path):
    agent = RecordingAgent(tmp_path)
    spin = "for i in 1 2; do (while :; do :; done) & done; sleep 3; kill $(jobs -p)"
    agent.answers = [{"start": [order(3, spin, cpu=500)]}]
    final = ended(agent, 3)
    cores = final["usage"]["cpu_seconds"] / (final["ended_at"] - final["started_at"])
    assert 0.2 < cores <= 0.6


def test_a_sleeping_and_a_spinning_job_use_different_cpu(tmp_path):
    agent = RecordingAgent(tmp_path)
    spin = "timeout 2 sh -c 'while :; do :; done'; true"
    agent.answers = [{"start": [order(4, "sleep 2"), order(5, spin)]}]
    sleeping, spinning = ended(agent, 4)["usage"], ended(agent, 5)["usage"]
    assert sleeping["cpu_seconds"] < 0.2 < spinning["cpu_seconds"]
    assert sleeping["peak_memory"] > 0 and spinning["peak_memory"] > 0


DAEMONS = "setsid sleep 300 & echo $! > setsid.pid; (sleep 301 & echo $! > fork.pid) ; "


def _daemons(agent: RecordingAgent, task_id: int) -> list[int]:
    run_until(agent, lambda: task_id in agent.tasks)
    work = Path(agent.tasks[task_id].workdir)
    files = [work / "setsid.pid", work / "fork.pid"]
    run_until(agent, lambda: all(f.exists() and f.read_text().strip() for f in files))
    return [int(f.read_text()) for f in files]


def test_setsid_and_double_fork_daemons_die_with_their_job(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [order(6, DAEMONS + "sleep 1")]}]
    pids = _daemons(agent, 6)
    assert all(alive(p) for p in pids)
    assert ended(agent, 6)["state"] == "Succeeded"
    assert not any(alive(p) for p in pids)


def test_setsid_and_double_fork_daemons_die_when_their_job_is_cancelled(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [order(7, DAEMONS + "sleep 300")]}]
    pids = _daemons(agent, 7)
    agent.order({"kill": [{"id": 7, "attempt": 0, "grace_seconds": 0.2}]})
    assert ended(agent, 7)["state"] == "Killed"
    assert not any(alive(p) for p in pids)


def test_a_restarted_agent_re_adopts_live_tasks_and_reaps_ended_ones(tmp_path):
    first = RecordingAgent(tmp_path)
    first.answers = [{"start": [order(8, DAEMONS + "sleep 300"), order(9, DAEMONS + "sleep 300")]}]
    kept, dropped = _daemons(first, 8), _daemons(first, 9)
    first.tasks[9].state = "Succeeded"  # as if it had ended and been reported meanwhile
    first._save()
    second = RecordingAgent(tmp_path)
    second.prepare()
    second._load()
    assert all(alive(p) for p in kept) and not any(alive(p) for p in dropped)
    assert second.tasks[8].cgroup == "task-8-0"
    second.order({"kill": [{"id": 8, "attempt": 0, "grace_seconds": 0.2}]})
    assert ended(second, 8)["state"] == "Killed"
    assert not any(alive(p) for p in kept)


@pytest.fixture
def gpu_nodes() -> Iterator[dict[int, str]]:
    """Two fake GPU device nodes (the NVIDIA major, no driver behind them: opening one the
    cgroup allows fails with ENXIO, one it denies with EPERM)."""
    folder = Path(tempfile.mkdtemp(prefix="berth-gpus-", dir="/dev/shm"))
    folder.chmod(0o755)
    nodes = {}
    for index in (0, 1):
        path = folder / f"nvidia{index}"
        os.mknod(path, 0o666 | 0o020000, os.makedev(195, index))
        path.chmod(0o666)
        nodes[index] = str(path)
    yield nodes
    shutil.rmtree(folder)


def test_a_task_cannot_open_a_gpu_it_was_not_given(tmp_path, gpu_nodes):
    fence = Fence(base_name="berth-test-node", gpu_nodes=gpu_nodes)
    agent = RecordingAgent(tmp_path, fence=fence)
    probe = f"exec 2>&1; : < {gpu_nodes[0]}; echo; : < {gpu_nodes[1]}"
    agent.answers = [{"start": [order(10, probe, devices=[0])]}]
    ended(agent, 10)
    mine, other = agent.output(10).split("\n", 1)
    assert "No such device or address" in mine  # the cgroup let it through to the driver
    assert "Operation not permitted" in other
    assert "devices" in agent.fence.describe()["enforced"]


def test_the_node_says_what_it_enforces_when_it_registers(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.prepare()
    agent.register()
    sent = next(body for path, body in agent.sent if path == "register/")["enforcement"]
    assert sent["mode"] == "required" and not sent["problem"] and not sent["missing"]
    assert {"memory", "cpu", "pids", "tracking"} <= set(sent["enforced"])


def test_a_required_node_that_cannot_enforce_runs_nothing(tmp_path):
    from scheduler.agent.cgroups import Found

    fence = Fence(base_name="berth-test-node", finder=lambda name: Found(None, "no cgroups"))
    agent = RecordingAgent(tmp_path, fence=fence)
    agent.answers = [{"start": [order(11, "touch ran")]}]
    final = ended(agent, 11)
    assert final["state"] == "Failed" and "cannot enforce memory" in final["message"]
    assert not list(tmp_path.glob("task-11-0-*/ran"))


def test_a_task_end_carries_its_gpus_mean_utilisation_where_nvml_measures_it(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.gpus.fake = False  # as with real GPUs: the samples below stand for NVML's
    readings = iter(
        [
            [{"index": 0, "utilization": 90}, {"index": 1, "utilization": 10}],
            [{"index": 0, "utilization": 70}, {"index": 1, "utilization": 30}],
        ]
    )
    agent.gpus.sample = lambda busy, levels=None: next(readings)  # type: ignore[method-assign]
    agent.answers = [{"start": [order(12, "sleep 1", devices=[0])]}]
    run_until(agent, lambda: 12 in agent.tasks)
    agent.lease_body()
    agent.lease_body()
    assert ended(agent, 12)["usage"]["gpu_utilization"] == 80.0


def test_an_agent_stopping_with_kill_on_exit_kills_its_tasks_daemons_too(tmp_path):
    agent = RecordingAgent(tmp_path, kill_on_exit=True)
    agent.answers = [{"start": [order(13, DAEMONS + "sleep 300")]}]
    with agent_running(agent, 20):
        work = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (work is None or not (work / "fork.pid").exists()):
            task = agent.tasks.get(13)
            work = Path(task.workdir) if task is not None else None
            time.sleep(0.05)
        assert work is not None
        time.sleep(0.2)
        pids = [int((work / f).read_text()) for f in ("setsid.pid", "fork.pid")]
        assert all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)
    assert agent.reports()[-1]["state"] == "Killed"
