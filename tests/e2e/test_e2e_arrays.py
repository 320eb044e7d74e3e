"""End to end: an array's elements run as real processes, each with its own index."""

from __future__ import annotations

import pytest

from scheduler.models import Job
from scheduler.states.names import JobState
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def test_each_element_runs_with_its_index_and_the_limit_holds(cluster: Cluster, api, owner):
    cluster.agent("e2e-a")
    cluster.scheduler()
    client = api(owner)
    spec = {
        "name": "sweep",
        "array": "0-2%2",
        "tasks": [{"name": "main", "command": "echo index=$BERTH_ARRAY_INDEX of"
                   " $BERTH_ARRAY_TASK_COUNT in $BERTH_ARRAY_JOB_ID; sleep 0.5",
                   "resources": {"cpu": "0.1", "memory": "16Mi"}}],
    }  # fmt: skip
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    parent_id = response.json()["id"]

    def finished() -> bool:
        job = Job.objects.filter(pk=parent_id).first()
        return bool(job and job.state == JobState.SUCCEEDED)

    wait_for(finished, what="every element to succeed")
    rows = client.get(f"/api/v1/jobs/?array={parent_id}").json()["results"]
    assert sorted(r["array_index"] for r in rows) == [0, 1, 2]
    for row in rows:
        assert row["state"] == "Succeeded"
        logs = client.get(f"/api/v1/jobs/{row['id']}/logs/").json()
        output = "".join(t["data"] for t in logs["tasks"])
        assert f"index={row['array_index']} of 3 in {parent_id}" in output
    # Never more than two elements at once: the third started after one had finished.
    spans = sorted(
        (j.started_at, j.finished_at)
        for j in Job.objects.filter(array_parent_id=parent_id)
    )  # fmt: skip
    assert spans[2][0] >= min(spans[0][1], spans[1][1])
