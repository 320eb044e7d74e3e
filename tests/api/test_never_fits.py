"""A job no registered node could ever run is refused at submit with a 400 naming the field,
the request and the largest offer; with no node registered anything is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Job, JobTemplate, Queue
from tests.factories import GI, make_node

pytestmark = pytest.mark.django_db


def spec(gpu: int = 0, memory: str = "1Gi", replicas: int = 1, **task: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": "big",
        "tasks": [
            {
                "name": "main",
                "replicas": replicas,
                "command": "true",
                "resources": {"cpu": 1, "memory": memory, "gpu": gpu},
                **task,
            }
        ],
    }
    return job


@pytest.fixture
def cluster(db: None) -> None:
    make_node("gpu-a", gpus=4, cpu=32000, memory=256 * GI, labels={"gpu-model": "a100"})
    make_node("gpu-b", gpus=4, cpu=32000, memory=256 * GI, labels={"gpu-model": "h100"})


def refusal(api, owner, body: dict[str, Any], url: str = "/api/v1/jobs/") -> dict[str, Any]:
    response = api(owner).post(url, body, format="json")
    assert response.status_code == 400, response.content
    return response.json()


def test_more_gpus_per_task_than_any_node_is_refused(api, owner, cluster):
    errors = refusal(api, owner, spec(gpu=6))
    assert errors["tasks.0.resources.gpu"] == ["6 per task requested, the largest node has 4"]
    assert not Job.objects.exists()


def test_more_memory_per_task_than_any_node_is_refused(api, owner, cluster):
    errors = refusal(api, owner, spec(memory="1Ti"))
    assert errors["tasks.0.resources.memory"] == [
        "1Ti per task requested, the largest node has 256Gi"
    ]


def test_a_selector_no_node_matches_is_refused(api, owner, cluster):
    errors = refusal(api, owner, spec(gpu=1, node_selector={"gpu-model": "b200"}))
    message = errors["tasks.0.node_selector"][0]
    assert "gpu-model=b200" in message and "a100, h100" in message, message


def test_a_selector_limits_the_largest_offer(api, owner, cluster):
    make_node("cpu-big", cpu=128000, memory=512 * GI, labels={"kind": "cpu"})
    errors = refusal(api, owner, spec(memory="300Gi", node_selector={"gpu-model": "a100"}))
    assert errors["tasks.0.resources.memory"] == [
        "300Gi per task requested, the largest matching node has 256Gi"
    ]


def test_a_gang_that_cannot_fit_the_empty_cluster_is_refused(api, owner, cluster):
    # Each task fits a node, but 3 tasks of 4 GPUs never fit on 2 nodes of 4 GPUs.
    errors = refusal(api, owner, spec(gpu=4, replicas=3))
    message = errors["min_available"][0]
    assert "3 tasks must start together" in message and "only 2 fit" in message, message


def test_a_gang_that_may_start_smaller_is_accepted(api, owner, cluster):
    body = {**spec(gpu=4, replicas=3), "min_available": 2}
    response = api(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content


def test_a_job_that_fits_is_accepted(api, owner, cluster):
    response = api(owner).post("/api/v1/jobs/", spec(gpu=4, replicas=2), format="json")
    assert response.status_code == 201, response.content


def test_anything_is_accepted_before_any_node_registers(api, owner):
    response = api(owner).post("/api/v1/jobs/", spec(gpu=64, memory="64Ti"), format="json")
    assert response.status_code == 201, response.content


def test_an_array_that_never_fits_is_refused(api, owner, cluster):
    errors = refusal(api, owner, {**spec(gpu=8), "array": "0-9"})
    assert "tasks.0.resources.gpu" in errors
    assert not Job.objects.exists()


def test_a_flow_step_that_never_fits_is_refused(api, owner, staff, cluster):
    JobTemplate.objects.create(name="train", spec=spec(gpu=1), owner=staff)
    flow = {
        "name": "sweep",
        "steps": [
            {"name": "ok", "template": "train"},
            {"name": "huge", "template": "train", "overrides": {"resources": {"gpu": 6}}},
        ],
    }
    errors = refusal(api, owner, flow, "/api/v1/flows/")
    assert errors == {
        "steps.1.tasks.0.resources.gpu": ["6 per task requested, the largest node has 4"]
    }


def test_a_template_whose_job_never_fits_is_refused_when_a_flow_uses_it(api, owner, staff, cluster):
    JobTemplate.objects.create(name="huge", spec=spec(node_selector={"zone": "mars"}), owner=staff)
    flow = {"name": "f", "steps": [{"name": "only", "template": "huge"}]}
    errors = refusal(api, owner, flow, "/api/v1/flows/")
    assert "no node has a zone label" in errors["steps.0.tasks.0.node_selector"][0]


def test_a_gang_larger_than_its_queue_may_ever_hold_is_refused(api, owner, cluster):
    Queue.objects.create(name="small", capability={"gpu": 4})
    errors = refusal(api, owner, {**spec(gpu=4, replicas=2), "queue": "small"})
    assert errors["queue"] == [
        '2 tasks starting together need gpu 8, more than queue "small" may ever hold (4)'
    ]
    body = {**spec(gpu=4, replicas=2), "queue": "small", "min_available": 1}
    assert api(owner).post("/api/v1/jobs/", body, format="json").status_code == 201


def test_the_queue_capability_holds_before_any_node_registers(api, owner):
    Queue.objects.create(name="small", capability={"memory": 8 * GI, "gpu": None})
    errors = refusal(api, owner, {**spec(memory="16Gi"), "queue": "small"})
    assert 'more than queue "small" may ever hold (8Gi)' in errors["queue"][0]


def test_an_inline_step_is_checked_with_its_queues_default_resources(api, owner, cluster):
    """A step that names no memory gets its queue's default when the controller makes its
    job, so the submit check sizes it the same way (and names the field under `spec.`)."""
    Queue.objects.filter(name="default").update(default_memory=512 * GI)
    step = {"name": "only", "spec": {"tasks": [{"name": "main", "command": "true"}]}}
    errors = refusal(api, owner, {"name": "f", "steps": [step]}, "/api/v1/flows/")
    assert list(errors) == ["steps.0.spec.tasks.0.resources.memory"]
    assert "the largest node has 256Gi" in errors["steps.0.spec.tasks.0.resources.memory"][0]
