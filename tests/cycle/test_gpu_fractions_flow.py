"""Fractions of a GPU through the server, as an agent sees them: four quarter-GPU jobs
share one device of a node that offers sharing, a whole-GPU job takes the other and a
second one waits; each start order says what it holds of its device; what a quarter GPU
used is accounted as a quarter (0.25 GPU for an hour is 0.25 GPU-hours), and the node's
devices list each occupant with its share."""

from __future__ import annotations

import pytest

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Allocation, Job
from scheduler.states.names import JobState
from tests.agentapi.test_protocol import (
    JOIN,
    join_token,  # noqa: F401 - the autouse fixture
    lease,
    register,
)
from tests.cycle.gpu_node import register_gpu_node, run_for_an_hour, submit_gpu_job

pytestmark = pytest.mark.django_db


def _register(sharing: list[str], token: str = JOIN, scheme: str = "Bearer") -> str:
    devices = [{"index": i, "uuid": f"g-{i}", "memory": 16 * 2**30} for i in range(2)]
    return register_gpu_node(sharing, devices, token, scheme)


def test_quarters_share_a_device_and_whole_gpus_wait_for_a_free_one(api, owner):
    token = _register(["timeslice"])
    quarters = [submit_gpu_job(api, owner, 0.25, f"q{i}") for i in range(4)]
    whole = [submit_gpu_job(api, owner, 1, "w1"), submit_gpu_job(api, owner, 1, "w2")]
    run_scheduler_cycle()
    held = {(a.task.job_id, a.device.index, a.share) for a in Allocation.objects.all()}
    shared = {d for _, d, s in held if s == 250}
    assert len(shared) == 1 and {j for j, _, s in held if s == 250} == set(quarters)
    assert {(j, s) for j, d, s in held if s == 1000} == {(whole[0], 1000)}
    assert {d for j, d, _ in held if j == whole[0]}.isdisjoint(shared)
    assert Job.objects.get(pk=whole[1]).pending_code  # it waits for a free device

    orders = {o["job_id"]: o for o in lease(token).json()["start"]}
    assert orders[quarters[0]]["shares"] == [0.25]
    assert orders[quarters[0]]["devices"] == sorted(shared)
    assert orders[whole[0]]["shares"] == [1.0]

    devices = api(owner).get("/api/v1/nodes/gpu-01/").json()["devices"]
    occupants = next(d["occupants"] for d in devices if d["index"] in shared)
    assert sorted((o["job"], o["share"]) for o in occupants) == [(j, 0.25) for j in quarters]


def test_a_quarter_gpu_for_an_hour_is_a_quarter_gpu_hour(api, owner):
    token = _register(["timeslice"])
    job_id = submit_gpu_job(api, owner, 0.25, "quarter")
    record = run_for_an_hour(token, job_id)
    assert record.gpu_seconds == pytest.approx(0.25 * record.wall_seconds)
    assert record.wall_seconds == pytest.approx(3600, abs=5)
    (row,) = api(owner).get("/api/v1/usage/").json()["results"]
    assert row["gpu_hours"] == pytest.approx(0.25, abs=0.002)
    assert not Allocation.objects.exists()


def test_a_node_without_sharing_never_takes_a_fraction(api, owner):
    token = _register(["timeslice"])
    job_id = submit_gpu_job(api, owner, 0.25, "quarter")
    _register([], token=token, scheme="Node")  # its agent restarts offering no sharing
    run_scheduler_cycle()
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.PENDING and not Allocation.objects.exists()
    assert job.pending_code == "NeverFits" and "no GPU sharing" in job.pending_message


def test_a_registration_with_an_unknown_sharing_mode_writes_nothing(api, owner):
    body = {"name": "gpu-02", "cpu": "16", "memory": "64Gi", "gpu_sharing": ["magic"],
            "devices": [{"index": 0}]}  # fmt: skip
    response = register(body, token=JOIN)
    assert response.status_code == 400
    assert "gpu_sharing" in response.json()
    assert not Job.objects.exists()
