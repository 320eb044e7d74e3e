"""End to end: while one user's job runs on a real agent, another user sends every hostile
input of issue 11 (findings 3 and 4) over HTTP. Each gets a small 4xx and writes nothing; a job
whose output holds NUL bytes is stored and shown; the first user's job still succeeds and the
node stays Ready throughout."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from scheduler.models import Flow, Job, JobTemplate, Node
from scheduler.states.names import JobState, NodeState
from tests.api.test_bodies import YAML_BOMB
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

TASK: dict[str, Any] = {"command": "true", "resources": {"cpu": "0.1", "memory": "16Mi"}}
JOB: dict[str, Any] = {"name": "ok", "tasks": [TASK]}


def post(url: str, token: str, body: str | bytes, content_type: str) -> tuple[int, bytes]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def hostile_inputs() -> list[tuple[str, str, str | bytes, str]]:
    """(what, path, body, content type): findings 3 and 4 of issue 11."""
    deep = "[" * 100_000 + "]" * 100_000
    cycle = [{"name": f"s{i}", "template": "t", "depends_on": [f"s{(i - 1) % 5000}"]}
             for i in range(5000)]  # fmt: skip
    with_cpu = {**JOB, "tasks": [{"command": "x", "resources": {"cpu": "1e1000000"}}]}
    return [
        ("alias bomb", "jobs/", YAML_BOMB, "application/yaml"),
        ("deep yaml", "jobs/", deep, "application/yaml"),
        ("deep json", "jobs/", '{"name": "x", "tasks": ' + deep + "}", "application/json"),
        ("huge cpu", "jobs/", json.dumps(with_cpu), "application/json"),
        ("huge int", "jobs/", '{"name": "x", "priority": 1' + "0" * 4000 + "}", "application/json"),
        (
            "20 MB command",
            "jobs/",
            b'{"name": "x", "tasks": [{"command": "' + b"x" * 20_000_000 + b'"}]}',
            "application/json",
        ),  # fmt: skip
        (
            "100,000 tasks",
            "jobs/",
            json.dumps({**JOB, "tasks": [{"command": "x", "replicas": 100_000}]}),
            "application/json",
        ),  # fmt: skip
        ("NUL in a name", "jobs/", json.dumps({**JOB, "name": "a\x00"}), "application/json"),
        ("surrogate", "jobs/", json.dumps({**JOB, "name": "a\ud800"}), "application/json"),
        (
            "5,000-step cycle",
            "flows/",
            json.dumps({"name": "f", "steps": cycle}),
            "application/json",
        ),  # fmt: skip
    ]


def test_hostile_inputs_harm_only_their_sender(cluster: Cluster, api, owner, outsider):
    JobTemplate.objects.create(name="t", spec={"tasks": [{"command": "true"}]})
    cluster.agent("e2e-a")
    cluster.scheduler()
    wait_for(lambda: Node.objects.filter(state=NodeState.READY).exists(), what="node Ready")
    running = api(owner).post(
        "/api/v1/jobs/", {**JOB, "name": "steady", "tasks": [{**TASK,
                                                               "command": "sleep 2; echo done"}]},
        format="json",
    )  # fmt: skip
    assert running.status_code == 201
    steady = running.json()["id"]

    token = Token.objects.create(user=outsider).key
    for what, path, body, content_type in hostile_inputs():
        status, answer = post(f"{cluster.url}/api/v1/{path}", token, body, content_type)
        assert status in (400, 413), (what, status, answer[:300])
        assert len(answer) < 10_000, what
        assert Node.objects.get().state == NodeState.READY, what
    assert not Job.objects.filter(owner=outsider).exists()
    assert not Flow.objects.exists()

    noisy = {**JOB, "name": "noisy", "tasks": [{**TASK,
                                                "command": "printf 'a\\0b\\377c\\n'"}]}  # fmt: skip
    status, answer = post(f"{cluster.url}/api/v1/jobs/", token, json.dumps(noisy),
                          "application/json")  # fmt: skip
    assert status == 201, answer
    noisy_id = json.loads(answer)["id"]

    def done(job_id: int) -> bool:
        return Job.objects.get(pk=job_id).state == JobState.SUCCEEDED

    wait_for(lambda: done(steady) and done(noisy_id), what="both jobs to succeed")
    logs: dict[str, Any] = api(outsider).get(f"/api/v1/jobs/{noisy_id}/logs/").json()
    assert logs["tasks"][0]["data"] == "a\ufffdb\ufffdc\n"
    assert Node.objects.get().state == NodeState.READY
