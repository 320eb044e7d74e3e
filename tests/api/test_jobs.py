"""/api/v1/jobs/: submit, read, filter, act; errors that name the field; ownership."""

from __future__ import annotations

import pytest
import yaml

from scheduler.models import Event, Job, Queue, Task, TaskLog
from scheduler.states.names import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def users_may_ask_for_priority_10(db):
    """SPEC is the design's example (priority 10): let users ask up to that here
    (tests/api/test_policy.py tests the cap itself)."""
    Queue.objects.filter(name="default").update(max_user_priority=10)


SPEC = {
    "name": "train",
    "priority": 10,
    "min_available": 2,
    "walltime": 3600,
    "max_retry": 1,
    "tasks": [
        {
            "name": "worker",
            "replicas": 2,
            "command": "python train.py",
            "env": {"LR": "0.1"},
            "resources": {"cpu": 4, "memory": "16Gi", "gpu": 1},
            "node_selector": {"gpu-model": "h100"},
        }
    ],
}


def test_it_submits_a_job_with_its_tasks(api, owner):
    response = api(owner).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["state"], body["owner"], body["queue"]) == (
        "train", "Pending", "alice", "default",
    )  # fmt: skip
    assert body["spec"]["tasks"][0]["resources"] == {"cpu": "4", "memory": "16Gi", "gpu": 1}
    tasks = Task.objects.filter(job_id=body["id"]).order_by("index")
    assert [(t.group, t.index, t.cpu, t.memory, t.gpu) for t in tasks] == [
        ("worker", 0, 4000, 16 * 2**30, 1),
        ("worker", 1, 4000, 16 * 2**30, 1),
    ]
    assert Event.objects.filter(job_id=body["id"], kind="JobSubmitted").exists()


def test_it_accepts_yaml(api, owner):
    response = api(owner).post(
        "/api/v1/jobs/", yaml.safe_dump(SPEC), content_type="application/yaml"
    )
    assert response.status_code == 201, response.content
    assert response.json()["min_available"] == 2


def test_it_says_where_yaml_is_broken(api, owner):
    response = api(owner).post("/api/v1/jobs/", "name: [oops", content_type="application/yaml")
    assert response.status_code == 400
    assert "YAML" in response.json()["detail"]


def _task(**fields):
    return {"name": "main", "command": "true", **fields}


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"name": "j", "queue": "nope", "tasks": [_task()]}, "queue", 'unknown queue "nope"'),
        (
            {"name": "j", "min_available": 3, "tasks": [_task(replicas=2)]},
            "min_available",
            "at most the total replicas (2)",
        ),
        (
            {"name": "j", "tasks": [_task(resources={"cpu": -1})]},
            "tasks.0.resources.cpu",
            "must not be negative",
        ),
        (
            {"name": "j", "tasks": [_task(resources={"memory": "lots"})]},
            "tasks.0.resources.memory",
            "like 512Mi or 16Gi",
        ),
        (
            {"name": "j", "tasks": [_task(resources={"gpu": 1.5})]},
            "tasks.0.resources.gpu",
            "whole number",
        ),
        ({"name": "Bad Name!", "tasks": [_task()]}, "name", "lowercase"),
        ({"name": "j", "tasks": [{"name": "main"}]}, "tasks.0.command", "is required"),
        ({"name": "j", "tasks": []}, "tasks", "non-empty list"),
        ({"name": "j", "tasks": [_task()], "colour": "red"}, "colour", "unknown field"),
        ({"name": "j", "tasks": [_task(replicas=0)]}, "tasks.0.replicas", "at least 1"),
        ({"name": "j", "walltime": "soon", "tasks": [_task()]}, "walltime", "whole number"),
        (
            {"name": "j", "tasks": [_task(env={"1BAD": "x"})]},
            "tasks.0.env.1BAD",
            "environment variable",
        ),
    ],
)
def test_it_rejects_a_bad_spec_naming_the_field(api, owner, spec, field, words):
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert field in errors, errors
    assert any(words in message for message in errors[field]), errors[field]
    assert not Job.objects.exists() and not Task.objects.exists()


def test_it_names_every_bad_field_at_once(api, owner):
    spec = {"name": "j", "min_available": 9, "tasks": [_task(resources={"gpu": 1.5, "cpu": "x"})]}
    errors = api(owner).post("/api/v1/jobs/", spec, format="json").json()
    assert {"min_available", "tasks.0.resources.gpu", "tasks.0.resources.cpu"} <= set(errors)


def _submit(client, name="j", **fields):
    response = client.post(
        "/api/v1/jobs/", {"name": name, "tasks": [_task()], **fields}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_it_lists_and_filters_jobs(api, owner, staff):
    client = api(owner)
    first = _submit(client, "first")
    second = _submit(client, "second", priority=5)
    Job.objects.filter(pk=first).update(state=JobState.RUNNING)
    _submit(api(staff), "staffs")

    listed = client.get("/api/v1/jobs/").json()
    assert [j["id"] for j in listed["results"]] == [second, first]
    assert listed["count"] == 2
    assert [j["id"] for j in client.get("/api/v1/jobs/?state=Running").json()["results"]] == [first]
    assert client.get("/api/v1/jobs/?queue=default").json()["count"] == 2
    assert api(staff).get("/api/v1/jobs/?owner=alice").json()["count"] == 2
    assert api(staff).get("/api/v1/jobs/").json()["count"] == 3
    page = client.get("/api/v1/jobs/?page_size=1").json()
    assert len(page["results"]) == 1 and page["next"]


def test_it_records_cancel_suspend_and_resume_requests(api, owner):
    client = api(owner)
    job_id = _submit(client)
    response = client.post(f"/api/v1/jobs/{job_id}/suspend/")
    assert response.status_code == 202
    assert response.json()["requested_action"] == "suspend"
    # Resume before the suspension is carried out withdraws it.
    assert client.post(f"/api/v1/jobs/{job_id}/resume/").json()["requested_action"] == ""
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").json()["requested_action"] == "cancel"


def test_it_refuses_actions_that_do_not_fit_the_state(api, owner):
    client = api(owner)
    job_id = _submit(client)
    assert client.post(f"/api/v1/jobs/{job_id}/resume/").status_code == 409
    Job.objects.filter(pk=job_id).update(state=JobState.SUCCEEDED)
    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 409
    assert "Succeeded" in response.json()["detail"]


def test_it_returns_events_and_logs(api, owner):
    client = api(owner)
    job_id = _submit(client)
    task = Task.objects.get(job_id=job_id)
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="hello ")
    TaskLog.objects.create(task=task, attempt=0, offset=6, data="world\n")
    events = client.get(f"/api/v1/jobs/{job_id}/events/").json()
    assert [e["kind"] for e in events["results"]] == ["JobSubmitted"]
    logs = client.get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert logs["tasks"][0]["data"] == "hello world\n"
    assert logs["tasks"][0]["next_offset"] == 12
    after = client.get(f"/api/v1/jobs/{job_id}/logs/?after=6").json()
    assert after["tasks"][0]["data"] == "world\n"
    assert client.get(f"/api/v1/jobs/{job_id}/logs/?after=x").status_code == 400


ENDPOINTS = [
    ("get", "/api/v1/jobs/{id}/", 200),
    ("get", "/api/v1/jobs/{id}/events/", 200),
    ("get", "/api/v1/jobs/{id}/logs/", 200),
    ("post", "/api/v1/jobs/{id}/suspend/", 202),
    ("post", "/api/v1/jobs/{id}/cancel/", 202),
]


@pytest.mark.parametrize(("method", "url", "ok"), ENDPOINTS)
@pytest.mark.parametrize(
    ("who", "allowed"),
    [("owner", True), ("teammate", False), ("outsider", False), ("staff", True), (None, None)],
)
def test_only_the_owner_and_staff_reach_a_job(api, request, owner, method, url, ok, who, allowed):
    job_id = _submit(api(owner))
    user = request.getfixturevalue(who) if who else None
    response = getattr(api(user), method)(url.format(id=job_id))
    if allowed is None:
        assert response.status_code in (401, 403)
    elif allowed:
        assert response.status_code == ok
    else:
        assert response.status_code == 404
        assert Job.objects.get(pk=job_id).requested_action == ""


def test_another_users_jobs_are_not_listed(api, owner, outsider):
    _submit(api(owner))
    assert api(outsider).get("/api/v1/jobs/").json()["count"] == 0


def test_drf_create_token_gives_a_working_token(owner):
    from django.core.management import call_command
    from rest_framework.test import APIClient

    call_command("drf_create_token", "alice")
    from rest_framework.authtoken.models import Token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get(user=owner).key}")
    assert client.get("/api/v1/jobs/").status_code == 200
