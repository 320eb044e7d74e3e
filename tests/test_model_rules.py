"""The models' own rules (clean()): the admin console and REST refuse the same rows, so one bad
row saved anywhere can never break a snapshot for everyone."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from scheduler.loop import run_scheduler_cycle
from scheduler.models import JobTemplate, Node, Queue
from tests.factories import make_job, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(staff):
    client = Client()
    client.force_login(staff)
    return client


def queue_form(**fields):
    form = {"name": "research", "weight": "1", "capability": "null", "priority": "0",
            "reclaimable": "on", "open": "on"}  # fmt: skip
    form.update(fields)
    return form


@pytest.mark.parametrize(
    ("capability", "problem"),
    [
        ({"memory": "16Gi"}, "memory: must be a whole number of bytes"),
        ({"gpu": True}, "gpu: must be a whole number of devices"),
        ({"gpu": -1}, "gpu: must be a whole number of devices"),
        ({"disk": 1}, "disk: unknown resource"),
        (["gpu"], "must be an object"),
    ],
)
def test_the_admin_refuses_a_capability_of_the_wrong_shape(console, capability, problem):
    url = reverse("admin:scheduler_queue_add")
    response = console.post(url, queue_form(capability=json.dumps(capability)))
    assert response.status_code == 200  # the form again, with the error
    assert problem in response.content.decode()
    assert not Queue.objects.filter(name="research").exists()


def test_the_admin_refuses_a_bad_weight_and_rest_says_the_same(console, api, staff):
    response = console.post(reverse("admin:scheduler_queue_add"), queue_form(weight="1e9"))
    assert "must be greater than 0 and at most 1e+06" in response.content.decode()
    body = {"name": "research", "weight": 1e9}
    response = api(staff).post("/api/v1/queues/", body, format="json")
    assert response.status_code == 400
    assert response.json()["weight"] == ["must be greater than 0 and at most 1e+06"]
    assert not Queue.objects.filter(name="research").exists()


def test_an_admin_edit_that_would_break_the_snapshot_is_refused_and_jobs_still_run(console, owner):
    make_node("n1")
    default = Queue.objects.get(name="default")
    url = reverse("admin:scheduler_queue_change", args=[default.pk])
    response = console.post(url, queue_form(name="default", capability='{"memory": "16Gi"}'))
    assert "memory: must be a whole number of bytes" in response.content.decode()
    default.refresh_from_db()
    assert default.capability is None
    job = make_job(owner)
    run_scheduler_cycle()
    assert job.tasks.get().node is not None  # placed: the snapshot was fine


def test_the_admin_checks_node_labels(console):
    node = make_node("n1")
    url = reverse("admin:scheduler_node_change", args=[node.pk])
    form = {"name": "n1", "labels": json.dumps({"zone": "a" * 300}), "cpu": str(node.cpu),
            "memory": str(node.memory), "admin_state": "",
            "devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0"}  # fmt: skip
    response = console.post(url, form)
    assert "labels.zone: at most 256 bytes, got 300" in response.content.decode()
    form["labels"] = json.dumps({"zone": ["a"]})
    response = console.post(url, form)
    assert "labels.zone: must be a string" in response.content.decode()
    assert Node.objects.get().labels == {}


def test_the_admin_checks_and_normalizes_template_specs(console):
    url = reverse("admin:scheduler_jobtemplate_add")
    form = {"name": "t", "description": "", "spec": json.dumps({"tasks": [{"command": ""}]})}
    response = console.post(url, form)
    assert "tasks.0.command: is required" in response.content.decode()
    form["spec"] = json.dumps({"queue": "nowhere", "tasks": [{"command": "x"}]})
    response = console.post(url, form)
    assert "unknown queue" in response.content.decode()
    assert not JobTemplate.objects.exists()
    form["spec"] = json.dumps({"tasks": [{"command": "x", "resources": {"memory": "1Gi"}}]})
    response = console.post(url, form)
    assert response.status_code == 302
    spec = JobTemplate.objects.get().spec
    assert spec["queue"] == "default" and spec["tasks"][0]["resources"]["memory"] == "1Gi"


def test_full_clean_is_what_commands_call():
    queue = Queue(name="q", capability={"memory": "16Gi"})
    with pytest.raises(ValidationError) as error:
        queue.full_clean()
    assert "capability" in error.value.message_dict


def test_rest_node_labels_follow_the_model_rules(api, staff):
    make_node("n1")
    response = api(staff).patch("/api/v1/nodes/n1/", {"labels": {"zone": 5}}, format="json")
    assert response.status_code == 400 and "labels.zone" in response.json()
    many = {f"k{i}": "v" for i in range(65)}
    response = api(staff).patch("/api/v1/nodes/n1/", {"labels": many}, format="json")
    assert response.status_code == 400 and "labels" in response.json()
    assert Node.objects.get().labels == {}
