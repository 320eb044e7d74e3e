"""Every spec field is bounded (docs/limits.md): a value past a limit is a 400 naming the field,
and nothing is written. Limits come from the BERTH_MAX_* settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.flows.controller import reconcile_flows
from scheduler.models import Event, Flow, Job, JobTemplate, Queue, Task
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def job(**fields: Any) -> dict[str, Any]:
    task = {"command": "true", **fields.pop("task", {})}
    return {"name": "j", "tasks": [task], **fields}


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (job(task={"resources": {"cpu": "1e300000"}}), "tasks.0.resources.cpu"),
        (job(task={"resources": {"cpu": "1e1000000"}}), "tasks.0.resources.cpu"),
        (job(task={"resources": {"memory": "9" * 100_000}}), "tasks.0.resources.memory"),
        (job(task={"resources": {"gpu": 10**15}}), "tasks.0.resources.gpu"),
        (job(task={"replicas": 100_000}), "tasks.0.replicas"),
        (job(task={"command": "x" * (64 * 1024 + 1)}), "tasks.0.command"),
        (job(task={"env": {f"K{i}": "v" for i in range(257)}}), "tasks.0.env"),
        (job(task={"env": {"K": "v" * (32 * 1024 + 1)}}), "tasks.0.env.K"),
        (job(task={"env": {"K" * 300: "v"}}), "tasks.0.env." + "K" * 64 + "..."),
        (job(task={"node_selector": {"gpu": "h" * 257}}), "tasks.0.node_selector.gpu"),
        (job(labels={f"k{i}": "v" for i in range(65)}), "labels"),
        (job(labels={"berth/flow": "1"}), "labels.berth/flow"),
        (job(priority=10**9), "priority"),
        (job(walltime=10**12), "walltime"),
        (job(active_deadline_seconds=2**40), "active_deadline_seconds"),
        (job(ttl_seconds_after_finished=2**40), "ttl_seconds_after_finished"),
        (job(min_available=2**40), "min_available"),
        ({"name": "j", "tasks": [{"command": "x", "replicas": 600}] * 2}, "tasks"),
        ({"name": "j", "tasks": [{"command": "x"}] * 1025}, "tasks"),
        (job(name="n" * 100_000), "name"),
    ],
)
def test_a_job_past_a_limit_is_refused_by_field(api, owner, spec, path):
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400, response.content
    assert path in response.json(), response.json()
    assert len(response.content) < 4000  # nothing huge is echoed
    assert not Job.objects.exists() and not Task.objects.exists()


def test_limits_come_from_the_settings(api, owner, settings):
    settings.BERTH_MAX_COMMAND_BYTES = 300
    response = api(owner).post("/api/v1/jobs/", job(task={"command": "x" * 301}), format="json")
    assert response.status_code == 400
    assert response.json()["tasks.0.command"] == ["at most 300 bytes, got 301"]
    settings.BERTH_MAX_TASKS_PER_JOB = 4000
    response = api(owner).post("/api/v1/jobs/", job(task={"replicas": 2000}), format="json")
    assert response.status_code == 201, response.content


def test_a_spec_at_the_limits_is_accepted(api, staff):
    spec = job(  # priority at its limit: staff (users are capped by their queue)
        priority=1_000_000,
        labels={f"k{i}": "v" * 256 for i in range(64)},
        task={"replicas": 1024, "command": "x" * 64 * 1024,
              "env": {f"K{i}": "v" * 1000 for i in range(256)}},
    )  # fmt: skip
    response = api(staff).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    assert Task.objects.count() == 1024


def test_many_unknown_fields_make_a_bounded_answer(api, owner):
    spec = job(**{f"field{i}": 1 for i in range(5000)})
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    assert len(response.json()) <= 50


@pytest.fixture
def template(staff):
    return JobTemplate.objects.create(
        name="step", spec={"queue": "default", "tasks": [{"name": "main", "command": "true"}]}
    )


def chain(steps: int, *, cycle: bool) -> dict[str, Any]:
    """Steps s0 <- s1 <- ... (each depends on the one before); `cycle` closes the loop."""
    out: list[dict[str, Any]] = [
        {"name": f"s{i}", "template": "step", "depends_on": [f"s{i - 1}"] if i else []}
           for i in range(steps)]  # fmt: skip
    if cycle:
        out[0]["depends_on"] = [f"s{steps - 1}"]
    return {"name": "f", "steps": out}


def test_a_flow_with_too_many_steps_or_items_is_refused(api, owner, template):
    response = api(owner).post("/api/v1/flows/", chain(257, cycle=True), format="json")
    assert response.status_code == 400 and "at most 256 steps" in response.json()["steps"][0]
    items = {"name": "f", "steps": [{"name": "a", "template": "step",
                                     "items": [{"I": str(i)} for i in range(1001)]}]}  # fmt: skip
    response = api(owner).post("/api/v1/flows/", items, format="json")
    assert response.status_code == 400 and "steps.0.items" in response.json()
    assert not Flow.objects.exists()


def test_a_5000_step_cycle_is_a_400_not_a_recursion_error(api, owner, template, settings):
    settings.BERTH_MAX_FLOW_STEPS = 10_000
    response = api(owner).post("/api/v1/flows/", chain(5000, cycle=True), format="json")
    assert response.status_code == 400, response.content[:300]
    message = response.json()["steps"][0]
    assert message.startswith("cycle of 5000 steps: s") and len(message) < 200
    assert not Flow.objects.exists()


def test_a_5000_step_chain_runs_without_recursion(api, owner, template, settings):
    settings.BERTH_MAX_FLOW_STEPS = 10_000
    response = api(owner).post("/api/v1/flows/", chain(5000, cycle=False), format="json")
    assert response.status_code == 201, response.content[:300]
    reconcile_flows()
    flow = Flow.objects.get()
    assert [j.step.name for j in flow.jobs.select_related("step")] == ["s0"]


def test_step_overrides_are_checked_like_job_fields(api, owner, template):
    flow: dict[str, Any] = {"name": "f", "steps": [{"name": "a", "template": "step",
                                    "overrides": {"priority": 10**9, "command": ""}}]}  # fmt: skip
    response = api(owner).post("/api/v1/flows/", flow, format="json")
    assert response.status_code == 400
    assert {"steps.0.overrides.priority", "steps.0.overrides.command"} <= set(response.json())
    flow["steps"][0]["overrides"] = {"queue": "nowhere"}
    response = api(owner).post("/api/v1/flows/", flow, format="json")
    assert response.status_code == 400 and "steps.0.overrides.queue" in response.json()
    assert not Flow.objects.exists()


def test_templates_are_bounded_and_checked_on_update(api, staff, template):
    body = {"name": "t", "description": "d" * 5000, "spec": {"tasks": [{"command": "x"}]}}
    response = api(staff).post("/api/v1/templates/", body, format="json")
    assert response.status_code == 400 and "description" in response.json()
    body = {"name": "step", "spec": {"queue": "nowhere", "tasks": [{"command": "x"}]}}
    response = api(staff).put("/api/v1/templates/step/", body, format="json")
    assert response.status_code == 400 and "spec.queue" in response.json()
    body = {"name": "other", "spec": {"tasks": [{"command": "x"}]}}
    response = api(staff).put("/api/v1/templates/step/", body, format="json")
    assert response.status_code == 400 and "name" in response.json()
    assert JobTemplate.objects.get().spec["queue"] == "default"


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/api/v1/jobs/?flow=99999999999999999999999", 400),
        # A job or flow id names an object: past any id it is missing, like the job itself.
        ("/api/v1/events/?job=99999999999999999999999", 404),
        ("/api/v1/events/?flow=-1", 400),
    ],
)
def test_ids_in_filters_are_bounded(api, owner, url, status):
    response = api(owner).get(url)
    assert response.status_code == status


def test_log_offsets_are_bounded(api, owner):
    made = make_job(owner)
    url = f"/api/v1/jobs/{made.pk}/logs/"
    assert api(owner).get(url + "?after=99999999999999999999999").status_code == 400
    assert api(owner).get(url + "?task=1" + "0" * 30).status_code == 400
    assert api(owner).get(url + "?task=0").status_code == 400  # not this job's task


def test_the_default_queue_cannot_be_deleted(api, staff):
    response = api(staff).delete("/api/v1/queues/default/")
    assert response.status_code == 400 and "name" in response.json()
    assert Queue.objects.filter(name="default").exists()


def test_a_resource_past_any_machine_is_refused(api, owner):
    for key, value in (("cpu", "2000000"), ("memory", "2048Pi"), ("gpu", 1025)):
        response = api(owner).post(
            "/api/v1/jobs/", job(task={"resources": {key: value}}), format="json"
        )
        assert response.status_code == 400, (key, response.content)
        assert f"tasks.0.resources.{key}" in response.json()
    assert not Event.objects.exists()


def test_error_messages_quote_values_briefly(api, owner):
    spec = job(priority="9" * 100_000, preemptible="x" * 100_000)
    response = api(owner).post("/api/v1/jobs/", json.dumps(spec), content_type="application/json")
    assert response.status_code == 400
    assert len(response.content) < 1000
