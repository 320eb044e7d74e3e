"""End to end: two sweeps from the same templates on a real agent; fail-fast frees GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Allocation, Flow, Job, JobTemplate
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def flow_state(flow_id: int) -> str:
    return Flow.objects.get(pk=flow_id).state


def start_sweep(client: Any, name: str, fail_item: str = "") -> int:
    spec = {
        "name": name, "parallelism": 2, "fail_fast": True,
        "steps": [
            {"name": "prep", "template": "step"},
            {"name": "train", "template": "step", "depends_on": ["prep"],
             "overrides": {"command": f'sleep 0.5; test "$LR" != "{fail_item}"'},
             "items": [{"LR": "0.1"}, {"LR": "0.01"}, {"LR": "0.001"}, {"LR": "0.0001"}]},
            {"name": "eval", "template": "step", "depends_on": ["train"]},
        ],
    }  # fmt: skip
    response = client.post("/api/v1/flows/", spec, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def test_two_sweeps_run_to_their_own_end_and_fail_fast_frees_gpus(cluster: Cluster, api, owner,
                                                                  staff):  # fmt: skip
    JobTemplate.objects.create(
        name="step",
        spec={"tasks": [{"name": "main", "command": "echo step $LR",
                         "resources": {"cpu": "0.1", "memory": "16Mi", "gpu": 1}}]},
    )  # fmt: skip
    cluster.agent("e2e-gpu", "--fake-gpus", "4")
    cluster.scheduler()
    client = api(owner)
    good = start_sweep(client, "good")
    bad = start_sweep(client, "bad", fail_item="0.01")

    wait_for(lambda: flow_state(bad) == "Failed", timeout=60, what="the bad sweep to fail")
    wait_for(lambda: flow_state(good) == "Succeeded", timeout=60, what="the good sweep")
    bad_flow = Flow.objects.get(pk=bad)
    assert "step train job bad-train-1" in bad_flow.message
    assert not Job.objects.filter(flow=bad_flow, state__in=("Pending", "Running")).exists()
    assert Job.objects.filter(flow_id=good).count() == 6
    assert set(Job.objects.filter(flow_id=good).values_list("state", flat=True)) == {"Succeeded"}
    wait_for(lambda: not Allocation.objects.exists(), what="every GPU to be free")
