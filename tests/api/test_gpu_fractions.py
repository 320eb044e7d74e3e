"""Part of a GPU at submit (docs/gpus.md): `resources.gpu: 0.25` and `gpu_memory` are taken
as asked, and a fraction no node could ever hold is refused with a 400 naming the field and
the largest offer, nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Device, Job, Queue, Task
from tests.factories import GI, make_node

pytestmark = pytest.mark.django_db


def spec(gpu: Any, replicas: int = 1, **resources: Any) -> dict[str, Any]:
    return {
        "name": "part",
        "tasks": [{"name": "main", "replicas": replicas, "command": "true",
                   "resources": {"cpu": 1, "memory": "1Gi", "gpu": gpu, **resources}}],
    }  # fmt: skip


@pytest.fixture
def sharing(db: None) -> None:
    make_node("share-a", gpus=2, cpu=16000, memory=64 * GI, gpu_sharing=["timeslice"])
    Device.objects.update(memory=16 * GI)


def refused(api: Any, owner: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert not Job.objects.exists() and not Task.objects.exists()
    return dict(response.json())


def test_it_takes_a_quarter_gpu_with_gpu_memory(api, owner, sharing):
    response = api(owner).post("/api/v1/jobs/", spec(0.25, gpu_memory="4Gi"), format="json")
    assert response.status_code == 201, response.content
    resources = response.json()["spec"]["tasks"][0]["resources"]
    assert (resources["gpu"], resources["gpu_memory"]) == (0.25, "4Gi")
    task = Task.objects.get()
    assert (task.gpu, task.gpu_share, task.gpu_memory) == (1, 250, 4 * GI)


@pytest.mark.parametrize(
    ("gpu", "field", "words"),
    [
        (1.5, "tasks.0.resources.gpu", "never spans devices"),
        ("2.5", "tasks.0.resources.gpu", "never spans devices"),
        (-0.25, "tasks.0.resources.gpu", "must not be negative"),
        (0.0001, "tasks.0.resources.gpu", "multiple of 0.001"),
        ("a quarter", "tasks.0.resources.gpu", "must be a number"),
    ],
)
def test_it_refuses_a_bad_fraction_naming_the_field(api, owner, sharing, gpu, field, words):
    errors = refused(api, owner, spec(gpu))
    assert words in errors[field][0], errors


def test_it_refuses_gpu_memory_above_the_largest_gpu(api, owner, sharing):
    errors = refused(api, owner, spec(0.5, gpu_memory="20Gi"))
    assert errors["tasks.0.resources.gpu_memory"] == [
        "20Gi of GPU memory requested, the largest GPU that may be shared has 16Gi"
    ]


def test_it_refuses_gpu_memory_without_a_fraction(api, owner, sharing):
    errors = refused(api, owner, spec(1, gpu_memory="4Gi"))
    assert "needs a fraction of a GPU" in errors["tasks.0.resources.gpu_memory"][0]


def test_it_refuses_a_fraction_where_no_node_shares_gpus(api, owner):
    make_node("whole-only", gpus=4)
    errors = refused(api, owner, spec(0.25))
    assert errors["tasks.0.resources.gpu"] == [
        "0.25 of a GPU requested, no node with GPUs offers GPU sharing"
        " (largest offer: 4 whole GPUs)"
    ]


def test_it_refuses_a_fraction_in_a_queue_whose_modes_no_node_offers(api, owner, sharing):
    Queue.objects.filter(name="default").update(gpu_sharing=["mig"])
    errors = refused(api, owner, spec(0.25))
    assert "in a mode the queue allows (mig)" in errors["tasks.0.resources.gpu"][0]


def test_it_refuses_a_gang_of_fractions_that_never_fits_together(api, owner):
    make_node("one-gpu", gpus=1, cpu=16000, memory=64 * GI, gpu_sharing=["timeslice"])
    errors = refused(api, owner, spec(0.4, replicas=3))
    assert "only 2 fit on the whole cluster" in errors["min_available"][0], errors
    # The same gang of thirds fits on one device.
    response = api(owner).post("/api/v1/jobs/", spec(0.3, replicas=3), format="json")
    assert response.status_code == 201, response.content


def test_a_queue_takes_only_known_sharing_modes(api, staff):
    response = api(staff).patch(
        "/api/v1/queues/default/", {"gpu_sharing": ["mps", "magic"]}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "magic" in response.json()["gpu_sharing"][0]
    response = api(staff).patch("/api/v1/queues/default/", {"gpu_sharing": ["mps"]}, format="json")
    assert response.status_code == 200 and response.json()["gpu_sharing"] == ["mps"]


def test_a_queue_capability_counts_a_gang_of_fractions_as_their_shares(api, owner, sharing):
    """Four quarters fit a queue of one GPU; three halves do not (1.5 GPUs)."""
    Queue.objects.filter(name="default").update(capability={"gpu": 1})
    response = api(owner).post("/api/v1/jobs/", spec(0.25, replicas=4), format="json")
    assert response.status_code == 201, response.content
    Job.objects.all().delete()
    errors = refused(api, owner, spec(0.5, replicas=3))
    assert errors["queue"] == [
        '3 tasks starting together need gpu 1.5, more than queue "default" may ever hold (1)'
    ]
