"""`berth submit --gpus 1g.10gb` against a live server, the loop and an agent whose fake GPU
has fake MIG instances (--fake-mig): the job runs on an instance, seeing only its UUID;
a profile no node has and text that is no profile are refused naming the field, exit
status 1, nothing created."""

from __future__ import annotations

import pytest

from scheduler.models import Job, MigInstance
from scheduler.states.names import JobState
from tests.cli.test_cli_live import berth, submitted_id
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def test_submit_asks_for_a_mig_instance(cluster: Cluster, token: str):
    cluster.agent("cli-mig", "--fake-gpus", "1", "--fake-mig", "0:1g.10gb,2g.20gb")
    cluster.scheduler()
    wait_for(lambda: MigInstance.objects.count() == 2, what="the agent's MIG instances")
    ok = berth(cluster, token, "submit", "--gpus", "1g.10gb", "--cpu", "0.1", "--mem", "16Mi",
               "--wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    job = Job.objects.get(pk=submitted_id(ok.stdout))
    assert job.state == JobState.SUCCEEDED
    assert job.spec["tasks"][0]["resources"]["gpu"] == "1g.10gb"
    uuid = MigInstance.objects.get(profile="1g.10gb").uuid
    shown = berth(cluster, token, "logs", str(job.pk))
    assert uuid in shown.stdout, shown

    for gpus, words in (("3g.40gb", "no node has an instance of it"), ("1g10gb", "MIG profile")):
        bad = berth(cluster, token, "submit", "--gpus", gpus, "--cpu", "0.1", "--mem", "16Mi",
                    "--", "true")  # fmt: skip
        assert bad.returncode == 1 and "tasks.0.resources.gpu" in bad.stderr, bad.stderr
        assert words in bad.stderr, bad.stderr
    assert Job.objects.count() == 1
