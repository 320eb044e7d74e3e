"""`berth submit --gpus 0.25` against a live server, the loop and an agent with a fake GPU:
the job runs on part of the device; `--gpus 1.5` and a too-large `--gpu-mem` are refused
with the server's message naming the field, exit status 1, nothing created."""

from __future__ import annotations

import pytest

from scheduler.models import Job, Node
from scheduler.states.names import JobState
from tests.cli.test_cli_live import berth, submitted_id
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def test_submit_asks_for_part_of_a_gpu(cluster: Cluster, token: str):
    cluster.agent("cli-gpu", "--fake-gpus", "1")
    cluster.scheduler()
    # A fraction is refused at submit until a node that shares its GPUs has registered.
    wait_for(lambda: Node.objects.filter(gpu_sharing=["timeslice"]).exists(), what="the agent")
    ok = berth(cluster, token, "submit", "--gpus", "0.25", "--gpu-mem", "1Gi", "--cpu", "0.1",
               "--mem", "16Mi", "--wait", "--", "echo", "quarter")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    job = Job.objects.get(pk=submitted_id(ok.stdout))
    assert job.state == JobState.SUCCEEDED
    resources = job.spec["tasks"][0]["resources"]
    assert (resources["gpu"], resources["gpu_memory"]) == (0.25, "1Gi")
    assert job.tasks.get().device_indices == [0]

    for args, field in (
        (["--gpus", "1.5"], "tasks.0.resources.gpu"),
        (["--gpus", "0.5", "--gpu-mem", "1Ti"], "tasks.0.resources.gpu_memory"),
    ):
        bad = berth(cluster, token, "submit", *args, "--cpu", "0.1", "--mem", "16Mi", "--",
                    "true")  # fmt: skip
        assert bad.returncode == 1 and field in bad.stderr, bad.stderr
    assert Job.objects.count() == 1
