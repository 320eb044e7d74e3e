"""GPUs held idle (scheduler/ops/gpu_idle.py): agents send each running GPU task's utilisation
with their lease renewals, the server keeps since when a task has been idle (hostile values
refused whole, naming the field; other nodes' tasks ignored), and the loop's housekeeping
flags a running job idle for BERTH_GPU_IDLE_MINUTES once per idle stretch (an event, the
job's field, the metric) and clears it when its GPUs are busy again."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from berth.cli import main
from scheduler.agent.client import Http
from scheduler.agent.gpus import GpuSampler, fake_level
from scheduler.agent.runtime import Agent, RunningTask, discover_gpus
from scheduler.agent.sim import SimCluster, SimNode
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job, Node, Task
from scheduler.ops import gpu_idle
from scheduler.states.names import JobState, TaskState
from tests.agentapi.test_protocol import JOIN, agent, register, rows
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(settings: Any) -> str:
    settings.BERTH_JOIN_TOKEN = JOIN
    settings.BERTH_GPU_IDLE_MINUTES = 30
    return str(register().json()["token"])  # gpu-01 with GPUs 0 and 1


def running(owner: Any, gpu: int = 1, name: str = "train") -> tuple[Job, Task]:
    job = make_job(owner, name, gpu=gpu, command="python train.py")
    place(job, Node.objects.get(name="gpu-01"), devices=gpu)
    return job, job.tasks.get()


def item(task: Task, utilization: Any, state: str = "Running") -> dict[str, Any]:
    return {"id": task.pk, "attempt": task.attempt, "state": state, "output_bytes": 0,
            "exit_code": None if state == "Running" else 0,
            "gpu_utilization": utilization}  # fmt: skip


def lease(token: str, *items: dict[str, Any], path: str = "lease/") -> Any:
    body = {"tasks": list(items), "wait": 0}
    return agent(token).post(f"/api/v1/agent/{path}", body, format="json")


def idle_since(task: Task) -> datetime | None:
    return Task.objects.get(pk=task.pk).gpu_idle_since


def age(task: Task, minutes: float) -> None:
    """The task has been idle `minutes` already (its mark moved back, after its start)."""
    since = timezone.now() - timedelta(minutes=minutes)
    Task.objects.filter(pk=task.pk).update(gpu_idle_since=since, started_at=since)


def events(job: Job) -> list[tuple[str, str]]:
    kinds = ("JobGpuIdle", "JobGpuBusy")
    return list(job.events.filter(kind__in=kinds).order_by("pk").values_list("kind", "reason"))


# --- the protocol ------------------------------------------------------------------------


def test_a_lease_marks_a_running_gpu_task_idle_once_and_busy_again(token: str, owner: Any) -> None:
    _, task = running(owner)
    before = timezone.now()
    assert lease(token, item(task, 0.4)).status_code == 200
    since = idle_since(task)
    assert since is not None and since >= before
    # Still idle: the mark stays where the stretch began (and the row is not written again).
    assert lease(token, item(task, 0)).status_code == 200
    assert idle_since(task) == since
    assert lease(token, item(task, 37.5)).status_code == 200
    assert idle_since(task) is None
    # No value (NVML could not read it) marks nothing.
    assert lease(token, item(task, None)).status_code == 200
    assert idle_since(task) is None


def test_a_mark_is_dropped_when_the_gpus_can_no_longer_be_read(token: str, owner: Any) -> None:
    """A first 0 % (a job loading its data), then NVML broken for good: the mark must not
    outlive its measurement and become a flag; a lease that leaves the field out says
    nothing either way (an older agent)."""
    _, task = running(owner)
    assert lease(token, item(task, 0)).status_code == 200
    assert idle_since(task) is not None
    absent = {k: v for k, v in item(task, 0).items() if k != "gpu_utilization"}
    assert lease(token, absent).status_code == 200
    assert idle_since(task) is not None
    assert lease(token, item(task, None)).status_code == 200
    assert idle_since(task) is None


def test_only_this_nodes_running_gpu_tasks_are_marked(token: str, owner: Any) -> None:
    other = make_node("gpu-02", gpus=1)
    theirs = make_job(owner, "theirs", gpu=1)
    place(theirs, other, devices=1)
    cpu_only = make_job(owner, "cpu-only", gpu=0)
    place(cpu_only, Node.objects.get(name="gpu-01"))
    foreign, cpu_task = theirs.tasks.get(), cpu_only.tasks.get()
    assert lease(token, item(foreign, 0), item(cpu_task, 0)).status_code == 200
    assert idle_since(foreign) is None and idle_since(cpu_task) is None


@pytest.mark.parametrize("value", [101, -1, 100.5, "0", True, [0], {"mean": 0}])
@pytest.mark.parametrize("path", ["lease/", "report/"])
def test_a_bad_utilisation_refuses_the_body_naming_the_field_and_writes_nothing(
    token: str, owner: Any, value: Any, path: str
) -> None:
    _, task = running(owner)
    before = rows()
    response = lease(token, item(task, value), path=path)
    assert response.status_code == 400
    assert "tasks.0.gpu_utilization" in response.json(), response.json()
    assert rows() == before


def test_a_utilisation_for_an_ended_task_is_refused(token: str, owner: Any) -> None:
    _, task = running(owner)
    response = lease(token, item(task, 0, state="Succeeded"))
    assert response.status_code == 400 and "tasks.0.gpu_utilization" in response.json()


def test_a_report_validates_it_but_keeps_it_from_leases_only(token: str, owner: Any) -> None:
    _, task = running(owner)
    assert lease(token, item(task, 0), path="report/").status_code == 200
    assert idle_since(task) is None


# --- the rule ----------------------------------------------------------------------------


def test_a_job_idle_for_the_configured_time_is_flagged_once_and_cleared_when_busy(
    token: str, owner: Any
) -> None:
    job, task = running(owner)
    assert lease(token, item(task, 0)).status_code == 200
    age(task, 29)
    assert gpu_idle.flag_idle_jobs() == 0  # not yet
    age(task, 31)
    assert gpu_idle.flag_idle_jobs() == 1
    job.refresh_from_db()
    assert job.gpu_idle_since == idle_since(task)
    assert events(job) == [("JobGpuIdle", "GpusIdle")]
    message = job.events.get(kind="JobGpuIdle").message
    assert "main-0 on gpu-01" in message and "31 min" in message and "below 1 %" in message
    # However many checks follow, one flag and one event per idle stretch.
    assert gpu_idle.flag_idle_jobs() == 0 and gpu_idle.flag_idle_jobs() == 0
    assert events(job) == [("JobGpuIdle", "GpusIdle")]
    # Busy again: the next lease clears the task's mark, the next check the job's flag.
    assert lease(token, item(task, 88)).status_code == 200
    assert gpu_idle.flag_idle_jobs() == 1
    job.refresh_from_db()
    assert job.gpu_idle_since is None
    assert events(job) == [("JobGpuIdle", "GpusIdle"), ("JobGpuBusy", "GpusBusy")]
    # A new idle stretch is a new flag.
    assert lease(token, item(task, 0)).status_code == 200
    age(task, 45)
    assert gpu_idle.flag_idle_jobs() == 1
    assert [k for k, _ in events(job)] == ["JobGpuIdle", "JobGpuBusy", "JobGpuIdle"]


def test_the_limit_is_a_setting_and_zero_turns_flagging_off(
    token: str, owner: Any, settings: Any
) -> None:
    job, task = running(owner)
    lease(token, item(task, 0))
    age(task, 6)
    settings.BERTH_GPU_IDLE_MINUTES = 5
    assert gpu_idle.flag_idle_jobs() == 1
    settings.BERTH_GPU_IDLE_MINUTES = 0
    assert gpu_idle.flag_idle_jobs() == 1  # the flag goes, without a "busy again" event
    job.refresh_from_db()
    assert job.gpu_idle_since is None and events(job) == [("JobGpuIdle", "GpusIdle")]
    assert gpu_idle.flag_idle_jobs() == 0


def test_a_job_that_stopped_running_is_unflagged_without_a_busy_event(
    token: str, owner: Any
) -> None:
    job, task = running(owner)
    lease(token, item(task, 0))
    age(task, 40)
    gpu_idle.flag_idle_jobs()
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    Task.objects.filter(pk=task.pk).update(state=TaskState.SUCCEEDED)
    assert gpu_idle.flag_idle_jobs() == 1
    job.refresh_from_db()
    assert job.gpu_idle_since is None and events(job) == [("JobGpuIdle", "GpusIdle")]


def test_an_earlier_attempts_mark_does_not_count(token: str, owner: Any) -> None:
    job, task = running(owner)
    # Attempt 0 went idle an hour ago; attempt 1 started a minute ago.
    Task.objects.filter(pk=task.pk).update(
        attempt=1, gpu_idle_since=timezone.now() - timedelta(hours=1),
        started_at=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip
    assert gpu_idle.flag_idle_jobs() == 0
    task.refresh_from_db()
    before = timezone.now()
    assert lease(token, item(task, 0)).status_code == 200  # its own stretch starts now
    since = idle_since(task)
    assert since is not None and since >= before


def test_the_scheduler_loop_runs_the_check(token: str, owner: Any) -> None:
    job, task = running(owner)
    lease(token, item(task, 0))
    age(task, 40)
    gpu_idle._checked_at = float("-inf")
    run_scheduler_cycle()
    assert events(job) == [("JobGpuIdle", "GpusIdle")]


# --- where it shows ----------------------------------------------------------------------


def flagged(owner: Any, token: str) -> Job:
    job, task = running(owner)
    lease(token, item(task, 0))
    age(task, 40)
    gpu_idle.flag_idle_jobs()
    job.refresh_from_db()
    return job


def test_the_api_shows_the_flag(token: str, owner: Any, api: Any) -> None:
    job = flagged(owner, token)
    detail = api(owner).get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["gpu_idle_since"] is not None
    listed = api(owner).get("/api/v1/jobs/").json()["results"]
    assert [j["gpu_idle_since"] is not None for j in listed] == [True]
    busy = make_job(owner, "busy")
    assert api(owner).get(f"/api/v1/jobs/{busy.pk}/").json()["gpu_idle_since"] is None


def test_the_metric_counts_flagged_running_jobs_per_queue(
    token: str, owner: Any, staff: Any
) -> None:
    flagged(owner, token)
    client = Client()
    client.force_login(staff)
    text = client.get("/metrics").content.decode()
    values = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "berth_jobs_gpu_idle"
    }
    assert values == {(("queue", "default"),): 1.0}


def test_berth_show_prints_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"id": 7, "name": "train", "state": "Running", "tasks": [],
           "gpu_idle_since": "2026-11-26T10:00:00Z"}  # fmt: skip

    class FakeClient:
        settings = SimpleNamespace(username="alice", url="http://test")

        def get(self, path: str) -> dict[str, Any]:
            return job

    monkeypatch.setattr(main, "client", FakeClient)
    out = CliRunner().invoke(main.cli, ["show", "7"]).output
    assert "gpu idle: GPUs held idle (below 1 %) since 2026-11-26T10:00:00Z" in out
    job["gpu_idle_since"] = None
    assert "gpu idle" not in CliRunner().invoke(main.cli, ["show", "7"]).output


# --- the agents --------------------------------------------------------------------------


def test_a_task_can_hold_its_fake_gpus_at_a_fixed_utilisation() -> None:
    assert fake_level({"BERTH_FAKE_GPU_UTILIZATION": "0"}) == 0
    assert fake_level({"BERTH_FAKE_GPU_UTILIZATION": " 40 "}) == 40
    for bad in ("101", "-1", "x", "0.5"):
        assert fake_level({"BERTH_FAKE_GPU_UTILIZATION": bad}) is None
    assert fake_level({}) is None and fake_level(None) is None
    sampler = GpuSampler([{"index": 0}, {"index": 1}, {"index": 2}], fake=True)
    samples = sampler.sample(busy={0, 1}, levels={0: 0})
    assert [s["utilization"] for s in samples][0] == 0  # held, but idle
    assert samples[0]["memory_used"] > 0 and samples[1]["utilization"] > 80
    assert samples[2]["utilization"] == 0  # not held


def test_the_agents_lease_says_each_running_gpu_tasks_utilisation(tmp_path: Any) -> None:
    agent_ = Agent("http://127.0.0.1:1", "join", name="n1", fake_gpus=3, work_dir=tmp_path)
    agent_.gpus = GpuSampler(discover_gpus(3, "n1"), fake=True)
    agent_.tasks[7] = RunningTask(7, 0, 0, str(tmp_path / "t7"), devices=[0, 1], fake_level=0)
    agent_.tasks[8] = RunningTask(8, 0, 0, str(tmp_path / "t8"), devices=[2])
    agent_.tasks[9] = RunningTask(9, 0, 0, str(tmp_path / "t9"))  # no GPU
    agent_.tasks[10] = RunningTask(10, 0, 0, str(tmp_path / "t10"), devices=[2],
                                   state="Succeeded")  # fmt: skip
    tasks = {t["id"]: t for t in agent_.lease_body()["tasks"]}
    assert tasks[7]["gpu_utilization"] == 0
    assert tasks[8]["gpu_utilization"] > 80
    assert "gpu_utilization" not in tasks[9] and "gpu_utilization" not in tasks[10]
    # A report stays as it was: the value rides on leases only.
    assert all("gpu_utilization" not in t for t in agent_._task_list(inline=True))


def test_the_simulated_node_says_it_too() -> None:
    node = SimNode("sim-0000", 8000, 2**34, 2, {}, Http("http://127.0.0.1:1"))
    cluster = SimCluster("http://127.0.0.1:1", "join", nodes=0, gpus=2, cpu=1, memory=1)
    cluster.apply_orders(node, {"start": [
        {"id": 5, "attempt": 0, "devices": [0],
         "env": {"BERTH_SIM_DURATION": "60", "BERTH_FAKE_GPU_UTILIZATION": "0"}},
        {"id": 6, "attempt": 0, "devices": [1], "env": {"BERTH_SIM_DURATION": "60"}}]})  # fmt: skip
    tasks = {t["id"]: t for t in node.lease_body()["tasks"]}
    assert tasks[5]["gpu_utilization"] == 0 and tasks[6]["gpu_utilization"] > 80


def test_a_huge_limit_means_a_year_not_a_crash(token: str, settings: Any, owner: Any) -> None:
    from scheduler.ops.gpu_idle import flag_idle_jobs

    _, task = running(owner)
    assert lease(token, item(task, 0)).status_code == 200
    settings.BERTH_GPU_IDLE_MINUTES = 1e12  # past what a timedelta can hold
    assert flag_idle_jobs() == 0
