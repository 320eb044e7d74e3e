"""Task output with NUL bytes or stray surrogates is stored (as U+FFFD) and shown; agent fields
that cannot be stored are refused by name. Either way the node keeps reporting."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from scheduler.agent.client import PROTOCOL
from scheduler.models import Node, TaskLog
from scheduler.states.names import NodeState, TaskState
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db
JOIN = "join-secret"
NODE = {"name": "n1", "cpu": "8", "memory": "64Gi"}


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def register(body: dict) -> tuple[int, dict]:
    response = APIClient().post(
        "/api/v1/agent/register/",
        data=json.dumps(body, ensure_ascii=True),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {JOIN}",
        HTTP_BERTH_AGENT_PROTOCOL=str(PROTOCOL),
    )
    return response.status_code, response.json()


def as_node(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {token}",
                       HTTP_BERTH_AGENT_PROTOCOL=str(PROTOCOL))  # fmt: skip
    return client


def test_output_with_nul_and_surrogates_is_stored_and_shown(api, owner):
    status, answer = register(NODE)
    assert status == 201
    job = make_job(owner, command="printf 'a\\0b'")
    place(job, Node.objects.get(), state=TaskState.RUNNING)
    task = job.tasks.get()
    body = {"attempt": 0, "offset": 0, "data": "a\x00b\ud800c\n"}
    response = as_node(answer["token"]).post(
        f"/api/v1/agent/tasks/{task.pk}/log/",
        data=json.dumps(body, ensure_ascii=True),  # \u0000 and \ud800 as JSON escapes
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert TaskLog.objects.get().data == "a\ufffdb\ufffdc\n"
    logs = api(owner).get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert logs["tasks"][0]["data"] == "a\ufffdb\ufffdc\n"
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and "a\ufffdb" in page.content.decode()
    beat = as_node(answer["token"]).post(
        "/api/v1/agent/report/", {"tasks": [{"id": task.pk, "state": "Running"}]}, format="json"
    )
    assert beat.status_code == 200
    assert Node.objects.get().state == NodeState.READY


@pytest.mark.parametrize("text", ["a\x00b", "a\udfffb"], ids=["nul", "surrogate"])
@pytest.mark.parametrize("field", ["hostname", "version", "labels.zone", "devices.0.model"])
def test_agent_fields_that_cannot_be_stored_are_refused(text, field):
    body: dict = {**NODE, "labels": {"zone": "a"}, "devices": [{"index": 0, "model": "x"}]}
    if field == "labels.zone":
        body["labels"]["zone"] = text
    elif field == "devices.0.model":
        body["devices"][0]["model"] = text
    else:
        body[field] = text
    status, answer = register(body)
    assert status == 400 and field in answer
    assert not Node.objects.exists()


def test_a_heartbeat_with_unstorable_text_is_refused_and_the_next_one_works(owner):
    _, answer = register(NODE)
    job = make_job(owner)
    place(job, Node.objects.get(), state=TaskState.RUNNING)
    task = job.tasks.get()
    bad = {"tasks": [{"id": task.pk, "state": "Failed", "exit_code": 1, "message": "x\x00",
                      "output_bytes": 0}]}  # fmt: skip
    response = as_node(answer["token"]).post(
        "/api/v1/agent/report/",
        data=json.dumps(bad, ensure_ascii=True),
        content_type="application/json",
    )
    assert response.status_code == 400 and "tasks.0.message" in response.json()
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING
    good = {"tasks": [{"id": task.pk, "state": "Running"}]}
    response = as_node(answer["token"]).post("/api/v1/agent/report/", good, format="json")
    assert response.status_code == 200
