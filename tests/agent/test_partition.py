"""An agent cut off from its server stops its tasks before the server may give them up
(scheduler/agent/partition.py), reports them Lost once it is heard again, and never stops
them while the server hears it. Against the scripted server of test_backpressure.py; the
namespaced, real-network version is tests/chaos/ (partition)."""

# ruff: noqa: F811 - `server`, the scripted server's fixture, is imported and then requested

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from scheduler.agent.partition import MARGIN, PartitionGuard
from scheduler.agent.runtime import Agent
from tests.agent.test_backpressure import (  # noqa: F401 - `server` is its fixture
    FakeServer,
    final_reports,
    server,
    start,
    wait_for,
)
from tests.agent.test_runtime import agent_running


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("timeout", "lease", "grace", "term", "deadline"),
    [
        (42.5, 10.0, 10.0, 30.0, 40.0),  # the defaults: SIGTERM a grace before the deadline
        (6.0, 1.0, 1.0, 2.5, 3.5),  # the e2e and chaos timings
        (5.0, 1.0, 10.0, 2.0, 2.5),  # a grace longer than the budget: never within 2 leases
        (4.5, 1.0, 1.0, 2.0, 2.0),  # a budget of two leases: SIGKILL at the deadline
    ],
)
def test_the_guard_stops_tasks_before_the_server_may_give_them_up(
    timeout: float, lease: float, grace: float, term: float, deadline: float
) -> None:
    clock = Clock()
    guard = PartitionGuard(timeout=timeout, lease=lease, grace=grace, clock=clock)
    assert (guard.term_after(), guard.deadline()) == (term, deadline)
    assert guard.deadline() == timeout - MARGIN  # renewal writes lag 1 s, clocks and latency
    clock.now += term - 0.01
    assert not guard.due()
    clock.now += 0.01
    assert guard.due() and guard.grace_left() == pytest.approx(deadline - term)
    guard.heard(clock.now - 0.5)  # a request sent half a second ago was answered
    assert not guard.due() and guard.silence() == pytest.approx(0.5)


def test_a_server_that_did_not_say_its_timeout_is_never_guarded_against() -> None:
    clock = Clock()
    guard = PartitionGuard(clock=clock)
    clock.now += 10_000
    assert not guard.due() and not guard.renewal_due()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running_pid(agent: Agent, task_id: int) -> int:
    with agent.lock:
        task = agent.tasks.get(task_id)
        return task.pid if task is not None and task.state == "Running" else 0


def test_an_agent_cut_off_stops_its_task_in_time_and_reports_it_lost(
    server: FakeServer, tmp_path: Path
) -> None:
    # Node lease 4 s, kill grace 1 s: no task may run 1.5 s after the last renewal was sent.
    server.heartbeat_timeout = 4.0
    server.orders = [start(5, "sleep 60")]
    agent = Agent(server.url, "join", name="node-f", work_dir=tmp_path)
    with agent_running(agent):
        pid = wait_for(lambda: _running_pid(agent, 5))
        wait_for(lambda: server.where("lease/", 200) and agent.partition.silence() < 0.5)
        server.refuse = {"lease/": [503] * 10_000, "report/": [503] * 10_000}  # cut off
        cut = time.monotonic()
        wait_for(lambda: not _alive(pid), timeout=10)
        assert time.monotonic() - cut < 1.5 + 1.0  # the deadline, and a busy machine's slack
        server.refuse = {}  # heard again
        (final,) = wait_for(lambda: final_reports(server, 5))
    assert final["state"] == "Lost"
    assert "cut off from the server" in final["message"]


def test_an_agent_the_server_hears_never_stops_its_tasks(
    server: FakeServer, tmp_path: Path
) -> None:
    # With leases of 0.2 s held ~0.1 s and a 4 s timeout the guard would stop it at 0.5 s of
    # silence; six seconds of normal running leave the task alone.
    server.heartbeat_timeout = 4.0
    server.orders = [start(6, "sleep 60")]
    agent = Agent(server.url, "join", name="node-g", work_dir=tmp_path)
    try:
        with agent_running(agent):
            pid = wait_for(lambda: _running_pid(agent, 6))
            time.sleep(6)
            assert _alive(pid) and _running_pid(agent, 6) == pid
            assert final_reports(server, 6) == []
    finally:
        os.killpg(pid, 9)


def test_a_lease_too_short_to_tell_cut_off_from_healthy_turns_the_guard_off() -> None:
    clock = Clock()
    guard = PartitionGuard(timeout=1.275, lease=0.3, grace=10, clock=clock)  # 4.25 leases of 0.3 s
    clock.now += 60
    assert not guard.enabled and not guard.due() and not guard.renewal_due()
