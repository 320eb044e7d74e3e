"""End to end with fake GPUs (issue #23): four quarter-GPU jobs share the agent's one device
at once, as real processes; a whole-GPU job submitted meanwhile waits for a free device and
runs once they are done. Fake GPUs offer time-slicing without any flag."""

from __future__ import annotations

import pytest

from scheduler.models import Allocation, Job, Node, Task
from scheduler.states.names import JobState, TaskState
from tests.e2e.conftest import Cluster, wait_for
from tests.e2e.test_e2e_jobs import job_state, one_task, submit

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def test_four_quarters_share_a_device_and_a_whole_gpu_waits(cluster: Cluster, api, owner):
    cluster.agent("e2e-share", "--fake-gpus", "1")
    cluster.scheduler()
    wait_for(lambda: Node.objects.filter(name="e2e-share").first(), what="the agent to register")
    assert Node.objects.get(name="e2e-share").gpu_sharing == ["timeslice"]
    client = api(owner)
    quarter = {"cpu": "0.1", "memory": "16Mi", "gpu": 0.25}
    # Each quarter runs until told to stop: all four must be seen running at once.
    quarters = [
        submit(client, one_task(f"q{i}", 'echo "on $CUDA_VISIBLE_DEVICES"; sleep 60',
                                resources=quarter))
        for i in range(4)
    ]  # fmt: skip

    def running_together() -> bool:
        # The jobs too: a job follows its task into Running in the cycle after the start.
        tasks = Task.objects.filter(job_id__in=quarters, state=TaskState.RUNNING).count()
        return tasks == 4 and all(job_state(q) == JobState.RUNNING for q in quarters)

    wait_for(running_together, timeout=60, what="four quarter-GPU jobs running at once")
    shares = list(Allocation.objects.values_list("task__job_id", "device__index", "share"))
    assert sorted(shares) == [(j, 0, 250) for j in sorted(quarters)]

    gpu = {"cpu": "0.1", "memory": "16Mi", "gpu": 1}
    whole = submit(client, one_task("whole", "echo whole on $CUDA_VISIBLE_DEVICES", resources=gpu))
    wait_for(lambda: Job.objects.get(pk=whole).pending_code, what="the whole-GPU job's status")
    assert job_state(whole) == JobState.PENDING
    assert all(job_state(q) == JobState.RUNNING for q in quarters)

    for q in quarters:
        assert client.post(f"/api/v1/jobs/{q}/cancel/").status_code in (200, 202)
    wait_for(lambda: job_state(whole) == JobState.SUCCEEDED, timeout=60, what="whole to run")
    logs = client.get(f"/api/v1/jobs/{whole}/logs/").json()
    assert "whole on 0" in "".join(t["data"] for t in logs["tasks"])
    first = client.get(f"/api/v1/jobs/{quarters[0]}/logs/").json()
    assert "on 0" in "".join(t["data"] for t in first["tasks"])
