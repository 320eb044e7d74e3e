"""MIG instances through the server, as an agent sees them: a node registers the fake MIG
instances an agent with --fake-mig finds, jobs asking for a profile each get a free instance
of it and their start order names it, a whole GPU never lands on the GPU in MIG mode, a
second registration without an instance forgets it, and an hour on a 1g instance is 1/7
of a GPU-hour."""

from __future__ import annotations

import pytest

from scheduler.agent.runtime import discover_gpus
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Allocation, Job, MigInstance
from tests.agentapi.test_protocol import (
    JOIN,
    join_token,  # noqa: F401 - the autouse fixture
    lease,
    register,
)
from tests.cycle.gpu_node import register_gpu_node, run_for_an_hour, submit_gpu_job

pytestmark = pytest.mark.django_db
PROFILES = {0: ["1g.10gb", "1g.10gb", "2g.20gb"]}


def _register(profiles: dict[int, list[str]], token: str = JOIN, scheme: str = "Bearer") -> str:
    devices = discover_gpus(2, "gpu-01", profiles)  # what the agent sends
    return register_gpu_node(["mig", "timeslice"], devices, token, scheme)


def test_profiles_take_free_instances_and_their_orders_name_them(api, owner):
    token = _register(PROFILES)
    assert sorted(MigInstance.objects.values_list("profile", flat=True)) == PROFILES[0][:2] + [
        "2g.20gb"
    ]
    small = [submit_gpu_job(api, owner, "1g.10gb", f"s{i}") for i in range(3)]
    whole = [submit_gpu_job(api, owner, 1, "w1"), submit_gpu_job(api, owner, 1, "w2")]
    run_scheduler_cycle()
    held = {a.task.job_id: (a.device.index, a.share, a.mig) for a in Allocation.objects.all()}
    assert {held[j][:2] for j in small[:2]} == {(0, 142)}
    assert len({held[j][2] for j in small[:2]}) == 2  # two different instances
    assert small[2] not in held and Job.objects.get(pk=small[2]).pending_code
    assert held[whole[0]] == (1, 1000, "")  # the GPU not in MIG mode, whole
    waiting = Job.objects.get(pk=whole[1])
    assert whole[1] not in held and waiting.pending_code  # never the MIG GPU

    orders = {o["job_id"]: o for o in lease(token).json()["start"]}
    assert orders[small[0]]["devices"] == [0] and orders[small[0]]["shares"] == [0.142]
    assert orders[small[0]]["mig"] == [held[small[0]][2]]
    assert held[small[0]][2].startswith("MIG-fake-gpu-01-0-")
    assert orders[whole[0]]["mig"] == []

    (gpu0,) = [
        d for d in api(owner).get("/api/v1/nodes/gpu-01/").json()["devices"] if d["index"] == 0
    ]
    assert sorted((m["profile"], m["job"]) for m in gpu0["mig"]) == sorted(
        [("1g.10gb", small[0]), ("1g.10gb", small[1]), ("2g.20gb", None)]
    )


def test_a_profile_only_a_gone_instance_had_never_fits(api, owner):
    token = _register(PROFILES)
    job_id = submit_gpu_job(api, owner, "2g.20gb", "big")
    _register({0: ["1g.10gb"]}, token=token, scheme="Node")  # instances remade by the admin
    assert list(MigInstance.objects.values_list("profile", flat=True)) == ["1g.10gb"]
    run_scheduler_cycle()
    job = Job.objects.get(pk=job_id)
    assert job.pending_code == "NeverFits" and "no MIG instance 2g.20gb" in job.pending_message


def test_an_hour_on_a_1g_instance_is_a_seventh_of_a_gpu_hour(api, owner):
    token = _register(PROFILES)
    job_id = submit_gpu_job(api, owner, "1g.10gb", "small")
    record = run_for_an_hour(token, job_id)
    assert record.gpu_seconds == pytest.approx(0.142 * record.wall_seconds)
    assert not Allocation.objects.exists()


def test_a_registration_with_a_bad_mig_instance_writes_nothing():
    devices = [{"index": 0, "mig": [{"profile": "1g.10gb", "uuid": "", "memory": -1}]}]
    body = {"name": "gpu-02", "cpu": "16", "memory": "64Gi", "devices": devices}
    response = register(body, token=JOIN)
    assert response.status_code == 400
    assert "devices.0.mig.0" in response.json()
    assert not MigInstance.objects.exists()
