"""A MIG instance at submit (docs/gpus.md): `resources.gpu: "1g.10gb"` is taken as a profile
when a registered node has an instance of it; text that is no profile, `gpu_memory` beside a
profile, and a profile no node has are refused with a 400 naming the field, nothing
written."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Device, Job, MigInstance, Queue, Task
from tests.factories import GI, make_node

pytestmark = pytest.mark.django_db


def spec(gpu: Any, replicas: int = 1, **resources: Any) -> dict[str, Any]:
    return {
        "name": "mig",
        "tasks": [{"name": "main", "replicas": replicas, "command": "true",
                   "resources": {"cpu": 1, "memory": "1Gi", "gpu": gpu, **resources}}],
    }  # fmt: skip


@pytest.fixture
def mig(db: None) -> None:
    make_node("mig-a", gpus=2, cpu=16000, memory=64 * GI, gpu_sharing=["mig"])
    device = Device.objects.get(node__name="mig-a", index=0)
    for k, profile in enumerate(["1g.10gb", "1g.10gb", "2g.20gb"]):
        MigInstance.objects.create(device=device, uuid=f"MIG-{k}", profile=profile, memory=GI)


def refused(api: Any, owner: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert not Job.objects.exists() and not Task.objects.exists()
    return dict(response.json())


def test_it_takes_a_profile_a_node_has(api, owner, mig):
    response = api(owner).post("/api/v1/jobs/", spec("1G.10gb", replicas=2), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["tasks"][0]["resources"]["gpu"] == "1g.10gb"
    rows = {(t.gpu, t.gpu_share, t.gpu_mig) for t in Task.objects.all()}
    assert rows == {(0, 142, "1g.10gb")}  # no whole device; 1/7 of a GPU, rounded down


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (spec("1g10gb"), "tasks.0.resources.gpu", "a MIG profile such as 1g.10gb"),
        (spec("8g.80gb"), "tasks.0.resources.gpu", "a MIG profile such as 1g.10gb"),
        (spec("1g.10gb", gpu_memory="1Gi"), "tasks.0.resources.gpu_memory", "its own memory"),
        (spec("3g.40gb"), "tasks.0.resources.gpu",
         "MIG profile 3g.40gb requested, no node has an instance of it (offered: 1g.10gb,"
         " 2g.20gb)"),
        (spec("2g.20gb", replicas=2), "min_available", "only 1 fit"),
    ],
)  # fmt: skip
def test_it_refuses_what_no_node_could_hold(api, owner, mig, body, field, words):
    errors = refused(api, owner, body)
    assert field in errors and words in str(errors[field]), errors


def test_a_gpu_in_mig_mode_is_no_whole_gpu_at_submit(api, owner, mig):
    # mig-a has two GPUs, one of them in MIG mode: two whole GPUs are more than it has.
    errors = refused(api, owner, spec(2))
    assert "tasks.0.resources.gpu" in errors, errors
    response = api(owner).post("/api/v1/jobs/", spec(1), format="json")
    assert response.status_code == 201, response.content


def test_a_queue_that_allows_no_mig_refuses_a_profile(api, owner, mig):
    Queue.objects.update_or_create(name="mps-only", defaults={"gpu_sharing": ["mps"]})
    body = {**spec("1g.10gb"), "queue": "mps-only"}
    errors = refused(api, owner, body)
    assert "the queue allows only mps" in str(errors["tasks.0.resources.gpu"]), errors


def test_an_arrays_elements_each_ask_for_the_profile(api, owner, mig):
    response = api(owner).post("/api/v1/jobs/", {**spec("1g.10gb"), "array": "0-2"}, format="json")
    assert response.status_code == 201, response.content
    rows = {(t.gpu, t.gpu_share, t.gpu_mig) for t in Task.objects.all()}
    assert Task.objects.count() == 3 and rows == {(0, 142, "1g.10gb")}
