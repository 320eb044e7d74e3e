"""Requests the node will enforce must make sense: memory below a few MiB (not even a shell
starts in it) or a pids limit of 0 are refused at submit, naming the field; small but real
requests (32Mi for `sleep`) and a pids limit are taken and reach the agent."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.agentapi.orders import start_messages
from scheduler.models import Job, Node
from scheduler.states.names import TaskState
from tests.factories import make_node, place

pytestmark = pytest.mark.django_db


def job(**resources: Any) -> dict[str, Any]:
    return {"name": "j", "tasks": [{"command": "sleep 1", "resources": resources}]}


@pytest.fixture(autouse=True)
def node() -> Node:
    return make_node("n1", cpu=8000)


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"memory": "1Mi"}, "tasks.0.resources.memory", "at least 4Mi"),
        ({"memory": 0}, "tasks.0.resources.memory", "at least 4Mi"),
        ({"pids": 0}, "tasks.0.resources.pids", "from 1 to"),
        ({"pids": -3}, "tasks.0.resources.pids", "from 1 to"),
        ({"pids": "many"}, "tasks.0.resources.pids", "from 1 to"),
    ],
)
def test_a_request_the_node_could_not_run_is_refused_naming_the_field(
    api, owner, resources, field, words
):
    response = api(owner).post("/api/v1/jobs/", job(**resources), format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()[field])
    assert not Job.objects.exists()


def test_a_small_real_request_and_a_pids_limit_reach_the_agent(api, owner, node):
    response = api(owner).post("/api/v1/jobs/", job(memory="32Mi", pids=64), format="json")
    assert response.status_code == 201, response.content
    created = Job.objects.get()
    place(created, node, state=TaskState.ASSIGNED)
    task = created.tasks.select_related("job__owner").get()
    (order,) = start_messages([task], node)
    assert order["resources"] == {"cpu": task.cpu, "memory": 32 * 2**20, "pids": 64}
