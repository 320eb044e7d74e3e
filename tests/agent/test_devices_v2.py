"""Device fencing on cgroup v2: an eBPF device program on each task's cgroup, for real.

This machine's cgroups are v1 (hybrid), but its cgroup2 mount (no controllers) takes device
programs on any of its directories: the tests make a cgroup of their own there, use it as the
agent's delegated v2 tree, and run real tasks in it as root. Each test removes what it made."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.agent import cgroups, devicebpf
from scheduler.agent.cgroups import BASE_DEVICES, V2, Found, Limits
from scheduler.agent.fence import Fence
from tests.agent.test_enforcement import ended, order
from tests.agent.test_enforcement import gpu_nodes as gpu_nodes  # noqa: F401 - a fixture
from tests.agent.test_runtime import RecordingAgent


@pytest.fixture
def unified() -> Iterator[Path]:
    """A fresh cgroup of this test's own in the machine's cgroup v2 hierarchy (under this
    process's v2 cgroup): what systemd would delegate to an agent. Removed with all below."""
    _, mount = cgroups._mounts(Path("/proc/self/mountinfo").read_text())
    own = cgroups._own_paths(Path("/proc/self/cgroup").read_text()).get("")
    if mount is None or own is None:
        pytest.skip("no cgroup2 mount here: device programs need the unified hierarchy")
    path = mount / own.lstrip("/") / f"test-devices-{os.getpid()}"
    path.mkdir()
    yield path
    _remove_tree(path)


def _remove_tree(path: Path) -> None:
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _remove_cgroup(child)
    _remove_cgroup(path)


def _remove_cgroup(path: Path) -> None:
    for pid in cgroups._read_pids(path / "cgroup.procs"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cgroups._wait_empty(cgroups.V2Cgroup(path.name, path))
    path.rmdir()


def v2_fence(own: Path, mode: str, gpus: dict[int, str], allow: tuple[str, ...] = ()) -> Fence:
    hierarchy = V2("berth-v2-node", own)
    hierarchy.prepare()
    return Fence(mode, base_name="berth-v2-node", gpu_nodes=gpus,
                 finder=lambda name: Found(hierarchy), allow=allow)  # fmt: skip


@pytest.mark.root
def test_a_device_the_node_allows_is_open_to_every_task(tmp_path, unified, gpu_nodes):
    """--allow-device (InfiniBand verbs, FUSE): here the second fake GPU's numbers, which its
    task was not given, are reached through the driver instead of refused."""
    fence = v2_fence(unified, "best-effort", gpu_nodes, allow=("c 195:1 rw",))
    agent = RecordingAgent(tmp_path, fence=fence)
    agent.answers = [{"start": [order(23, f"exec 2>&1; : < {gpu_nodes[1]}", devices=[0])]}]
    ended(agent, 23)
    assert "No such device or address" in agent.output(23), agent.output(23)
    fence.close()


@pytest.mark.root
def test_on_cgroup_v2_a_task_opens_its_own_gpu_and_not_one_it_was_not_given(
    tmp_path, unified, gpu_nodes
):
    # best-effort: this cgroup2 mount has no memory, cpu or pids controller to enforce
    fence = v2_fence(unified, "best-effort", gpu_nodes)
    agent = RecordingAgent(tmp_path, fence=fence)
    probe = (f"exec 2>&1; echo x > /dev/null && echo null ok; : < {gpu_nodes[0]}; echo;"
             f" : < {gpu_nodes[1]}")  # fmt: skip
    agent.answers = [{"start": [order(20, probe, devices=[0])]}]
    ended(agent, 20)
    null, mine, other = agent.output(20).split("\n", 2)
    assert null == "null ok"
    assert "No such device or address" in mine  # the program let it through to the driver
    assert "Operation not permitted" in other
    assert "devices" in fence.describe()["enforced"] and fence.hierarchy is not None
    assert fence.hierarchy.names() == []  # the task's cgroup (and its program) is gone
    fence.close()


@pytest.mark.root
def test_a_v2_task_cgroup_has_one_device_program_even_when_made_again(unified):
    hierarchy = V2("berth-v2-node", unified)
    hierarchy.prepare()
    assert "devices" in hierarchy.enforced
    assert hierarchy.names() == []  # the probe's cgroup is gone
    group = hierarchy.create("task-1-0", Limits(devices=()))
    path = unified / "berth-v2-node" / "task-1-0"
    assert devicebpf.attached(path) == 1
    hierarchy.create("task-1-0", Limits(devices=()))  # an agent restarting makes it again
    assert devicebpf.attached(path) == 1
    assert group.remove()
    hierarchy.remove_base()


@pytest.mark.root
def test_a_v2_node_whose_parent_forbids_device_programs_refuses_gpu_tasks(unified, gpu_nodes):
    # A device program attached with no flags above the agent's cgroup: none may be attached
    # below it, so the agent cannot fence its tasks' devices (the kernel says EPERM).
    devicebpf.attach(unified, ["a"])
    fence = v2_fence(unified, "required", gpu_nodes)
    fence.setup()
    assert "devices" in fence.describe()["missing"]
    assert fence.refuses and "no eBPF device program on cgroup v2" in fence.problem
    assert "not permitted" in fence.problem
    fence.close()


# --- the program itself ----------------------------------------------------------------


def test_device_rules_are_read_in_the_devices_allow_syntax():
    assert devicebpf.parse("c 195:0 rwm") == devicebpf.Rule("c", 195, 0, 7)
    assert devicebpf.parse("c 136:* rw") == devicebpf.Rule("c", 136, None, 6)
    assert devicebpf.parse("b *:* m") == devicebpf.Rule("b", None, None, 1)
    assert devicebpf.parse("a") == devicebpf.Rule("a", None, None, 7)
    for bad in ("c 1:3", "x 1:3 rwm", "c 1-3 rwm", "c 1:3 rwx", "c a:3 r"):
        with pytest.raises(ValueError):
            devicebpf.parse(bad)


def test_each_rule_is_a_block_that_jumps_past_itself_when_it_does_not_match():
    code = devicebpf.assemble([devicebpf.parse("c 195:0 rw")])
    instructions = [code[i : i + 8] for i in range(0, len(code), 8)]
    # 6 loads, 4 tests + allow + exit, deny + exit
    assert len(instructions) == 6 + 6 + 2
    offsets = [int.from_bytes(i[2:4], "little", signed=True) for i in instructions[6:10]]
    assert offsets == [5, 4, 3, 2]  # each lands on the deny after the block's exit
    assert instructions[7][0] == devicebpf.JSET_K and instructions[7][4] == 1  # mknod: no


def test_a_rule_that_allows_everything_ends_the_program():
    code = devicebpf.assemble([devicebpf.parse("a"), devicebpf.parse("c 1:3 rwm")])
    assert len(code) == (6 + 2) * 8


def test_the_base_allowlist_parses():
    assert len([devicebpf.parse(r) for r in BASE_DEVICES]) == len(BASE_DEVICES)


def test_loading_lifts_a_low_memlock_limit_as_libbpf_does() -> None:
    """Before Linux 5.11 each program counts against RLIMIT_MEMLOCK: a low limit would make
    starts fail after a dozen tasks. In a child, so the test's own limits stay as they were."""
    import resource

    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the limit was lifted and the program loaded
        code = 1
        try:
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, hard))
            os.close(devicebpf.load([devicebpf.parse("c 1:3 rwm")]))
            code = 0 if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == hard else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
