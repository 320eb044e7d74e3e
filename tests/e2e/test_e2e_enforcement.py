"""End to end, as root: a job past its memory ends OutOfMemory through its retries while a
neighbour on the same node succeeds, and users see what their jobs used."""

from __future__ import annotations

import pytest

from scheduler.models import Job, UsageRecord
from scheduler.states.names import JobState
from tests.e2e.conftest import Cluster, wait_for
from tests.e2e.test_e2e_jobs import job_state, one_task, submit

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.root]
HOG = "python3 -c \"x = b'x' * (1536 << 20); print('allocated')\""


def test_a_job_past_its_memory_ends_out_of_memory_after_its_retries(cluster: Cluster, api, owner):
    cluster.agent("e2e-mem")
    cluster.scheduler()
    client = api(owner)
    small = {"cpu": "0.5", "memory": "256Mi"}
    hog = submit(client, one_task("hog", HOG, max_retry=1, resources=small))
    neighbour = submit(client, one_task("neighbour", "sleep 2; echo fine", resources=small))

    wait_for(lambda: job_state(hog) == JobState.FAILED, timeout=60, what="the hog to fail")
    wait_for(lambda: job_state(neighbour) == JobState.SUCCEEDED, what="the neighbour")
    job = Job.objects.get(pk=hog)
    assert (job.reason, job.retries) == ("OutOfMemory", 1)
    assert "memory limit 256Mi" in job.message and "after 1 retries" in job.message
    task = client.get(f"/api/v1/jobs/{hog}/").json()["tasks"][0]
    assert task["reason"] == "OutOfMemory" and task["usage"]["memory_percent"] >= 90
    assert UsageRecord.objects.filter(job_id=hog).count() == 2  # both attempts measured
    logs = client.get(f"/api/v1/jobs/{neighbour}/logs/").json()
    assert "fine" in "".join(t["data"] for t in logs["tasks"])
