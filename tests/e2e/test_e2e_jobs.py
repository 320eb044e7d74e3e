"""End to end: the scheduler loop and real agents run real commands (issue: jobs run for real)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from scheduler.models import Allocation, Event, Job, Node, Task
from scheduler.states.names import JobState, NodeState, TaskState
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def submit(client: Any, spec: dict[str, Any]) -> int:
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def job_state(job_id: int) -> str | None:
    job = Job.objects.filter(pk=job_id).first()
    return job.state if job else None


def one_task(name: str, command: str, **fields: Any) -> dict[str, Any]:
    resources = fields.pop("resources", {"cpu": "0.1", "memory": "16Mi"})
    return {
        "name": name,
        **fields,
        "tasks": [{"name": "main", "replicas": 1, "command": command, "resources": resources}],
    }


def test_it_runs_a_real_command_and_keeps_its_output(cluster: Cluster, api, owner):
    cluster.agent("e2e-a")
    cluster.scheduler()
    client = api(owner)
    job_id = submit(client, one_task("hello", "echo hi; sleep 1"))

    wait_for(lambda: job_state(job_id) == JobState.SUCCEEDED, what="job to succeed")
    task = Task.objects.get(job_id=job_id)
    assert (task.state, task.exit_code) == (TaskState.SUCCEEDED, 0)
    logs = client.get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert "hi" in "".join(t["data"] for t in logs["tasks"])


def test_it_retries_a_failing_job_then_fails_it_with_the_exit_code(cluster: Cluster, api, owner):
    cluster.agent("e2e-a")
    cluster.scheduler()
    job_id = submit(api(owner), one_task("flaky", "exit 3", max_retry=2))

    wait_for(lambda: job_state(job_id) == JobState.FAILED, what="job to fail")
    job = Job.objects.get(pk=job_id)
    assert job.retries == 2
    assert "exited with code 3" in job.message
    assert Task.objects.get(job_id=job_id).attempt == 2
    assert Event.objects.filter(job_id=job_id, reason="Retrying").count() == 2


def test_it_preempts_a_low_priority_job_which_then_resumes(cluster: Cluster, api, owner):
    cluster.agent("e2e-gpu", "--fake-gpus", "1")
    cluster.scheduler()
    client = api(owner)
    gpu = {"cpu": "0.1", "memory": "16Mi", "gpu": 1}
    # Users may only lower their priority below the queue's cap (0): -1 is the low one.
    low = submit(client, one_task("low", "sleep 4", priority=-1, resources=gpu))
    wait_for(lambda: job_state(low) == JobState.RUNNING, what="low-priority job to run")

    high = submit(client, one_task("high", "sleep 1", priority=0, resources=gpu))
    wait_for(lambda: job_state(low) == JobState.SUSPENDED, what="low to be preempted")
    assert Job.objects.get(pk=low).reason == "Preempted"
    wait_for(lambda: job_state(high) == JobState.SUCCEEDED, timeout=40, what="high to succeed")
    # The preempted job comes back by itself once the device is free, and finishes.
    wait_for(lambda: job_state(low) == JobState.SUCCEEDED, timeout=40, what="low to resume")
    low_task = Task.objects.get(job_id=low)
    assert low_task.attempt >= 1  # it ran again as a new attempt
    assert not Allocation.objects.exists()


def test_it_deletes_finished_jobs_by_ttl_and_never_suspended_ones(cluster: Cluster, api, owner):
    cluster.agent("e2e-a")
    cluster.scheduler()
    client = api(owner)
    done = submit(client, one_task("done", "true", ttl_seconds_after_finished=1))
    kept = submit(client, one_task("kept", "sleep 30", ttl_seconds_after_finished=1))
    wait_for(lambda: job_state(kept) == JobState.RUNNING, what="kept to run")
    assert client.post(f"/api/v1/jobs/{kept}/suspend/").status_code in (200, 202)

    wait_for(lambda: job_state(done) is None, what="TTL to delete the finished job")
    wait_for(lambda: job_state(kept) == JobState.SUSPENDED, what="kept to be suspended")
    assert Job.objects.filter(pk=kept).exists()


def test_it_kills_a_job_past_its_walltime(cluster: Cluster, api, owner):
    cluster.agent("e2e-a")
    cluster.scheduler()
    job_id = submit(api(owner), one_task("long", "sleep 600", walltime=2))

    wait_for(lambda: job_state(job_id) == JobState.FAILED, what="walltime to kill the job")
    job = Job.objects.get(pk=job_id)
    assert job.reason == "WalltimeExceeded"
    assert Task.objects.get(job_id=job_id).state == TaskState.KILLED


def test_it_reruns_a_job_elsewhere_when_its_node_dies(cluster: Cluster, api, owner):
    first = cluster.agent("e2e-first")
    wait_for(lambda: Node.objects.filter(name="e2e-first").exists(), what="first node")
    cluster.scheduler()
    job_id = submit(api(owner), one_task("moving", "sleep 2", max_retry=1))
    wait_for(lambda: job_state(job_id) == JobState.RUNNING, what="job to run")
    assert Task.objects.get(job_id=job_id).node_id == Node.objects.get(name="e2e-first").pk

    cluster.agent("e2e-second")
    os.killpg(first.pid, signal.SIGKILL)  # the machine dies with its agent
    wait_for(
        lambda: Node.objects.get(name="e2e-first").state == NodeState.NOT_READY,
        what="node to go NotReady",
    )
    wait_for(lambda: job_state(job_id) == JobState.SUCCEEDED, timeout=40, what="job to rerun")
    task = Task.objects.get(job_id=job_id)
    assert task.node_id == Node.objects.get(name="e2e-second").pk
    assert Job.objects.get(pk=job_id).retries == 1


def test_it_never_double_books_with_two_schedulers(cluster: Cluster, api, owner):
    cluster.simagent("--nodes", "4", "--gpus", "2", "--cpu", "8", "--memory", "16Gi")
    wait_for(lambda: Node.objects.count() == 4, what="simulated nodes")
    first = cluster.scheduler("scheduler-1", interval=0.05)
    cluster.scheduler("scheduler-2", interval=0.05)
    client = api(owner)
    gpu = {"cpu": "0.5", "memory": "64Mi", "gpu": 1}
    ids = [
        submit(
            client,
            {
                **one_task(f"burst-{i}", "true", resources=gpu),
                "tasks": [
                    {
                        "name": "main",
                        "command": "true",
                        "resources": gpu,
                        "env": {"BERTH_SIM_DURATION": "0.3"},
                    }
                ],
            },
        )
        for i in range(40)
    ]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == len(ids),
        timeout=90,
        what="the backlog to finish",
    )
    leaders = [
        name for name in ("scheduler-1", "scheduler-2") if "now the leader" in cluster.log(name)
    ]
    assert len(leaders) == 1, leaders  # the other stood by the whole time

    # The standby takes over when the leader dies.
    leader = first if leaders == ["scheduler-1"] else cluster.procs[-1]
    os.killpg(leader.pid, signal.SIGKILL)
    late = submit(client, one_task("late", "true", resources=gpu))
    wait_for(lambda: job_state(late) == JobState.SUCCEEDED, timeout=30, what="standby to lead")
    assert all("now the leader" in cluster.log(n) for n in ("scheduler-1", "scheduler-2"))

    # Every job was placed exactly once: no task was bound by both schedulers.
    for job_id in [*ids, late]:
        assert Event.objects.filter(job_id=job_id, kind="Scheduled").count() == 1, job_id
