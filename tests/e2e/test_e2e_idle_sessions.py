"""Idle interactive GPU sessions with real processes (docs/interactive.md#idle-gpu-sessions):
`run_scheduler` and a real agent whose fake GPUs report what each task's env asks
(BERTH_FAKE_GPU_UTILIZATION, scheduler/agent/gpus.py). An interactive job whose GPU stays at
0 % is warned, then ended by the scheduler: the agent kills its task and the job ends
Cancelled with `GpuIdleTimeout`; a batch job idle beside it only gets flagged and runs on."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Event, Job, Queue, Task
from scheduler.states.names import JobState, TaskState
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def idle_job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields,
            "tasks": [{"name": "main", "command": "exec sleep infinity",
                       "env": {"BERTH_FAKE_GPU_UTILIZATION": "0"},
                       "resources": {"cpu": "0.1", "memory": "16Mi", "gpu": 1}}]}  # fmt: skip


def submit(client: Any, spec: dict[str, Any]) -> int:
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def test_an_idle_gpu_session_is_ended_by_the_scheduler_and_a_batch_job_beside_it_runs_on(
    cluster: Cluster, api: Any, owner: Any
) -> None:
    Queue.objects.filter(name="default").update(interactive_gpu_idle_minutes=0.02)  # 1.2 s
    cluster.env.update({"BERTH_IDLE_SESSION_GRACE_MINUTES": "0", "BERTH_GPU_IDLE_MINUTES": "0.02"})
    cluster.agent("e2e-idle", "--fake-gpus", "2")
    cluster.scheduler()
    client = api(owner)
    session = submit(client, idle_job("idle-shell", interactive={"persist": True}))
    batch = submit(client, idle_job("idle-batch"))

    def ended() -> bool:
        return Job.objects.get(pk=session).state == JobState.CANCELLED

    wait_for(ended, timeout=90, what="the idle session to be ended")
    job = Job.objects.get(pk=session)
    assert job.reason == "GpuIdleTimeout" and "no terminal input" in job.message
    # The agent stopped its task for real (its report says Killed), once warned.
    assert Task.objects.get(job_id=session).state == TaskState.KILLED
    kinds = list(Event.objects.filter(job_id=session).values_list("kind", flat=True))
    assert kinds.count("SessionIdleWarning") == 1
    # The batch job, as idle, is flagged and still runs.
    wait_for(lambda: Job.objects.get(pk=batch).gpu_idle_since is not None, timeout=30,
             what="the batch job to be flagged")  # fmt: skip
    other = Job.objects.get(pk=batch)
    assert other.state == JobState.RUNNING and other.idle_warned_at is None
    assert not Event.objects.filter(job_id=batch, kind__startswith="SessionIdle").exists()
    assert client.post(f"/api/v1/jobs/{batch}/cancel/").status_code in (200, 202)
