"""The models' own rules (clean()): the admin console and REST refuse the same rows, so one bad
row saved anywhere can never break a snapshot for everyone."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from scheduler.agent.client import PROTOCOL
from scheduler.cycle.loop import run_scheduler_cycle
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


@pytest.mark.parametrize(
    ("capability", "path"),
    [({"gpu": -1}, "capability.gpu"), ({"memory": "lots"}, "capability.memory"),
     ({"disk": 1}, "capability.disk"), (["gpu"], "capability")],
)  # fmt: skip
def test_rest_refuses_the_capabilities_the_admin_refuses(api, staff, capability, path):
    body = {"name": "research", "capability": capability}
    response = api(staff).post("/api/v1/queues/", body, format="json")
    assert response.status_code == 400 and path in response.json()
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


# --- the same bad value through every door -------------------------------------------------


def job_form(job, **fields):
    form = {"name": job.name, "owner": str(job.owner_id), "queue": str(job.queue_id),
            "priority": str(job.priority), "preemptible": "on",
            "min_available": str(job.min_available), "max_retry": "0", "walltime": "",
            "ttl_seconds_after_finished": "", "active_deadline_seconds": "", "array_limit": "",
            "tasks-TOTAL_FORMS": "0", "tasks-INITIAL_FORMS": "0"}  # fmt: skip
    form.update(fields)
    return form


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("priority", 2_000_000, "must be at most 1000000, got 2000000"),
        ("priority", -2_000_000, "must be at least -1000000, got -2000000"),
        ("max_retry", 101, "must be at most 100, got 101"),
        ("walltime", 0, "must be at least 1, got 0"),
        ("min_available", 3, "must be at most the total replicas (2), got 3"),
    ],
)
def test_rest_and_the_admin_refuse_the_same_job_values(console, api, owner, field, value, problem):
    spec = {"name": "j", "tasks": [{"name": "main", "replicas": 2, "command": "true"}]}
    response = api(owner).post("/api/v1/jobs/", {**spec, field: value}, format="json")
    assert response.status_code == 400 and problem in str(response.json()[field])

    job = make_job(owner, "j", replicas=2)
    url = reverse("admin:scheduler_job_change", args=[job.pk])
    response = console.post(url, job_form(job, **{field: str(value)}))
    assert response.status_code == 200 and problem in response.content.decode()
    job.refresh_from_db()
    assert getattr(job, field) != value


def test_the_admin_saves_a_job_within_the_rules(console, owner):
    job = make_job(owner, "j", replicas=2)
    url = reverse("admin:scheduler_job_change", args=[job.pk])
    response = console.post(url, job_form(job, priority="500", max_retry="3"))
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.priority, job.max_retry) == (500, 3)


def test_an_agent_registering_refuses_the_labels_rest_and_the_admin_refuse(api, staff):
    """run_agent --labels, run_simagent and up register through the agent protocol."""
    from django.test import override_settings

    long = {"zone": "a" * 300}
    body = {"name": "n1", "cpu": "8", "memory": "1Gi", "labels": long}
    with override_settings(BERTH_JOIN_TOKEN="join"):
        response = api(None).post("/api/v1/agent/register/", body, format="json",
                                  HTTP_AUTHORIZATION="Bearer join",
                                  HTTP_BERTH_AGENT_PROTOCOL=str(PROTOCOL))  # fmt: skip
    assert response.status_code == 400
    assert response.json()["labels.zone"] == ["at most 256 bytes, got 300"]
    assert not Node.objects.exists()
    make_node("n1")
    response = api(staff).patch("/api/v1/nodes/n1/", {"labels": long}, format="json")
    assert response.json()["labels.zone"] == ["at most 256 bytes, got 300"]
