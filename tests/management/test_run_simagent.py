"""`manage.py run_simagent` for real: fake nodes in one process over the agent protocol."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from scheduler.models import Allocation, Node, Task, TaskLog
from scheduler.states.names import TaskState
from tests.factories import make_job
from tests.management.test_run_agent import LOCK, assign, manage, server, stop, wait_for

__all__ = ["server"]  # the fixture


def test_it_runs_fake_nodes_whose_tasks_end_with_the_asked_exit_code(server, owner, tmp_path):
    sim = manage(tmp_path, "run_simagent", "--server", server,
                 "--nodes", "3", "--gpus", "2", "--cpu", "16", "--memory", "128Gi",
                 "--prefix", "fake", "--labels", "pool=sim")  # fmt: skip
    try:
        wait_for(lambda: Node.objects.count() == 3, what="three nodes")
        tasks = []
        with LOCK:
            nodes = list(Node.objects.order_by("name"))
            assert [n.name for n in nodes] == ["fake-0000", "fake-0001", "fake-0002"]
            assert all((n.cpu, n.memory, n.labels) == (16000, 128 * 2**30, {"pool": "sim"})
                       for n in nodes)  # fmt: skip
            assert all(n.devices.count() == 2 for n in nodes)
            for node in nodes:
                job = make_job(owner, f"on-{node.name}", gpu=1, command="train")
                job.spec["tasks"][0]["env"] = {"BERTH_SIM_EXIT": "2", "BERTH_SIM_DURATION": "0.2"}
                job.save()
                task = job.tasks.get()
                assign(task, node, [0])
                tasks.append(task)

        def all_failed() -> bool:
            return Task.objects.filter(state=TaskState.FAILED, exit_code=2).count() == 3

        wait_for(all_failed, what="three tasks to exit with 2")
        wait_for(lambda: TaskLog.objects.count() == 3, what="a log line from each")
        with LOCK:
            assert not Allocation.objects.exists()
            for task in tasks:
                (line,) = TaskLog.objects.filter(task=task).values_list("data", flat=True)
                assert "exit 2" in line
    finally:
        code = stop(sim)
    assert code == 0, (tmp_path / "command.log").read_text()


def test_it_exits_with_a_clear_error_on_bad_options():
    base = ["--server", "http://x"]
    with pytest.raises(CommandError, match="--nodes"):
        call_command("run_simagent", *base, "--nodes", "0")
    with pytest.raises(CommandError, match="memory"):
        call_command("run_simagent", *base, "--nodes", "1", "--memory", "lots")
