"""The cgroup interface: v2 against a fake delegated tree (this machine's v2 mount has no
controllers), v1 on this machine's real controllers (as root). v2 device programs are tested
for real in test_devices_v2.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scheduler.agent import cgroups
from scheduler.agent.cgroups import V2, Limits, detect

MiB = 2**20


def fake_v2(tmp_path: Path) -> Path:
    """A delegated cgroup as systemd hands it to a unit with Delegate=yes: the agent in it."""
    own = tmp_path / "system.slice" / "berth-agent.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "memory.swap.max").write_text("max\n")
    return own


def proc_files(tmp_path: Path, root: Path) -> tuple[Path, Path]:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"30 24 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "31 24 0:27 / /proc rw - proc proc rw\n"
    )
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("0::/system.slice/berth-agent.service\n")
    return mountinfo, self_cgroup


@pytest.mark.root
def test_v2_is_found_and_the_agent_moves_into_a_leaf_handing_controllers_down(tmp_path):
    root = tmp_path / "cg"
    own = fake_v2(root)
    found = detect("berth-n1", *proc_files(tmp_path, root))
    assert isinstance(found.hierarchy, V2)
    assert (own / "agent" / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (own / "berth-n1" / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert set(found.hierarchy.enforced) == {"memory", "cpu", "pids", "swap", "tracking"}


def test_a_v2_task_cgroup_gets_its_limits_and_reports_its_usage(tmp_path):
    own = fake_v2(tmp_path)
    hierarchy = V2("berth-n1", own)
    (own / "berth-n1").mkdir()
    task = own / "berth-n1" / "task-5-1"
    task.mkdir()  # the kernel would fill it with its files: these two are written if present
    (task / "memory.swap.max").write_text("max\n")
    (task / "memory.oom.group").write_text("0\n")
    group = hierarchy.create("task-5-1", Limits(memory=256 * MiB, cpu=500, pids=64))
    assert (task / "memory.max").read_text() == str(256 * MiB)
    assert (task / "memory.swap.max").read_text() == "0"
    assert (task / "memory.oom.group").read_text() == "1"
    assert (task / "cpu.max").read_text() == "50000 100000"
    assert (task / "pids.max").read_text() == "64"
    (task / "memory.peak").write_text(f"{300 * MiB}\n")
    (task / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (task / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    usage = group.usage()
    assert (usage.peak_memory, usage.cpu_seconds, usage.oom_kills) == (300 * MiB, 2.5, 1)
    assert hierarchy.names() == ["task-5-1"]


def test_a_v2_kill_uses_cgroup_kill(tmp_path):
    own = fake_v2(tmp_path)
    hierarchy = V2("berth-n1", own)
    (own / "berth-n1" / "task-1-0").mkdir(parents=True)
    (own / "berth-n1" / "task-1-0" / "cgroup.kill").write_text("0")
    group = hierarchy.open("task-1-0")
    assert group is not None
    group.kill_all()
    assert (own / "berth-n1" / "task-1-0" / "cgroup.kill").read_text() == "1"


def test_v2_where_no_device_program_attaches_does_not_claim_devices_and_gpu_nodes_refuse(
    tmp_path,
):
    from scheduler.agent.cgroups import Found
    from scheduler.agent.fence import Fence

    hierarchy = V2("berth-n1", fake_v2(tmp_path))
    hierarchy.prepare()  # the fake tree is no cgroup: the kernel refuses the device program
    fence = Fence("required", gpu_nodes={0: "/dev/nvidia0"}, finder=lambda n: Found(hierarchy))
    fence.setup()
    assert fence.refuses and fence.describe()["missing"] == ["devices"]
    assert "cannot enforce devices: no eBPF device program on cgroup v2" in fence.problem
    assert hierarchy.names() == []  # the probe's cgroup was removed again


@pytest.mark.root
def test_v1_task_cgroups_get_their_limits_in_each_controller():
    found = detect("berth-test-node")
    hierarchy = found.hierarchy
    if hierarchy is None or hierarchy.version != "v1":
        pytest.skip(f"this test is for cgroup v1 machines ({found.problem or 'v2 found'})")
    group = hierarchy.create("task-1-0", Limits(memory=64 * MiB, cpu=250, pids=32))
    try:
        assert isinstance(group, cgroups.V1Cgroup)
        memory, cpu, pids = group.dirs["memory"], group.dirs["cpu"], group.dirs["pids"]
        assert int((memory / "memory.limit_in_bytes").read_text()) == 64 * MiB
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "25000"
        assert (pids / "pids.max").read_text().strip() == "32"
        assert "a *:* rwm" not in (group.dirs["devices"] / "devices.list").read_text()
        own = Path("/proc/self/cgroup").read_text()
        assert any(line.split(":")[2] in str(memory) for line in own.splitlines()
                   if ":memory:" in line)  # fmt: skip
    finally:
        group.remove()
        hierarchy.remove_base()
