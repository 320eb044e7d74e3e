"""The agent protocol over HTTP: register, heartbeat, log upload."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler.models import Allocation, Event, Node, Task, TaskLog
from scheduler.states import NodeState, TaskState
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db
JOIN = "join-secret"
NODE = {"name": "gpu-01", "cpu": "8", "memory": "64Gi", "labels": {"gpu-model": "h100"},
        "devices": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}  # fmt: skip


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def register(body=NODE, token=JOIN):
    client = APIClient()
    return client.post("/api/v1/agent/register/", body, format="json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip


def agent(token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {token}")
    return client


def beat(token, tasks=(), **extra):
    return agent(token).post("/api/v1/agent/heartbeat/", {"tasks": list(tasks), **extra},
                             format="json")  # fmt: skip


def test_it_registers_a_node_with_its_devices():
    response = register()
    assert response.status_code == 201
    node = Node.objects.get(name="gpu-01")
    assert (node.cpu, node.memory, node.labels) == (8000, 64 * 2**30, {"gpu-model": "h100"})
    assert list(node.devices.values_list("index", "uuid")) == [(0, "GPU-a"), (1, "GPU-b")]
    assert node.token_hash and response.json()["token"] not in node.token_hash


@pytest.mark.parametrize("token", ["", "wrong"])
def test_it_refuses_a_wrong_join_token(token):
    assert register(token=token).status_code == 401
    assert not Node.objects.exists()


def test_it_refuses_registration_without_a_join_token_configured(settings):
    settings.BERTH_JOIN_TOKEN = ""
    assert register().status_code == 403


def test_it_names_bad_registration_fields():
    response = register({"name": "Bad Name", "cpu": -1, "memory": "lots", "devices": [{"x": 1}]})
    assert response.status_code == 400
    assert {"name", "cpu", "memory", "devices.0"} <= set(response.json())


def _assigned(owner, node, gpu=1):
    job = make_job(owner, gpu=gpu, command="echo hi")
    place(job, node, state=TaskState.ASSIGNED, devices=gpu)
    return job, job.tasks.get()


def test_a_heartbeat_starts_assigned_tasks_with_their_env(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    answer = beat(token).json()
    (start,) = answer["start"]
    assert (start["id"], start["command"], start["devices"]) == (task.pk, "echo hi", [0])
    env = start["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert (env["BERTH_JOB_ID"], env["RANK"], env["WORLD_SIZE"]) == (str(job.pk), "0", "1")
    assert env["MASTER_PORT"] == str(20000 + job.pk % 20000)

    beat(token, [{"id": task.pk, "attempt": 0, "state": "Running"}])
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING and task.started_at
    assert beat(token, [{"id": task.pk, "attempt": 0, "state": "Running"}]).json()["start"] == []

    done = [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0}]
    beat(token, done)
    task.refresh_from_db()
    assert (task.state, task.exit_code) == (TaskState.SUCCEEDED, 0)
    assert not Allocation.objects.exists()  # the device is free once the agent confirms
    # A retried report changes nothing more.
    events = Event.objects.count()
    assert beat(token, done).status_code == 200
    assert Event.objects.count() == events


@pytest.mark.parametrize(
    "tasks",
    [
        [{"id": "x", "attempt": 0, "state": "Running"}],
        [{"id": 1, "attempt": 0, "state": "Exploded"}],
        [{"id": 1, "attempt": -1, "state": "Running"}],
        [{"id": 1, "attempt": 0, "state": "Failed"}],  # a failure needs its exit code
        "not a list",
    ],
)
def test_a_malformed_report_is_rejected_and_changes_nothing(owner, tasks):
    token = register().json()["token"]
    node = Node.objects.get()
    _, task = _assigned(owner, node)
    good = {"id": task.pk, "attempt": 0, "state": "Running"}
    before = Node.objects.get().last_heartbeat
    response = beat(token, [good, *tasks] if isinstance(tasks, list) else tasks)
    assert response.status_code == 400
    task.refresh_from_db()
    assert task.state == TaskState.ASSIGNED  # the good part of the report was not applied
    assert Node.objects.get().last_heartbeat == before


def test_a_node_token_acts_only_for_its_own_node(owner):
    mine = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    _, theirs = _assigned(owner, Node.objects.get(name="gpu-02"))
    response = beat(mine, [{"id": theirs.pk, "attempt": 0, "state": "Failed", "exit_code": 1}])
    assert response.status_code == 403
    theirs.refresh_from_db()
    assert theirs.state == TaskState.ASSIGNED
    log = agent(mine).post(f"/api/v1/agent/tasks/{theirs.pk}/log/",
                           {"attempt": 0, "offset": 0, "data": "x"}, format="json")  # fmt: skip
    assert log.status_code == 404 and not TaskLog.objects.exists()
    assert beat("not-a-token").status_code == 401


def test_it_reconciles_what_the_agent_runs_with_what_the_server_wants(owner):
    token = register().json()["token"]
    node = Node.objects.get()
    lost_job = make_job(owner, "lost")
    place(lost_job, node, state=TaskState.RUNNING)
    killed_job, killed = _assigned(owner, node)
    Task.objects.filter(pk=killed.pk).update(kill_requested=True)
    # The agent runs a stale attempt of a task and a task the server never heard of.
    stale_job = make_job(owner, "stale")
    place(stale_job, node, state=TaskState.RUNNING)
    stale = stale_job.tasks.get()
    Task.objects.filter(pk=stale.pk).update(attempt=2)
    answer = beat(token, [{"id": stale.pk, "attempt": 1, "state": "Running"},
                          {"id": 99999, "attempt": 0, "state": "Running"}]).json()  # fmt: skip
    assert {(k["id"], k["attempt"]) for k in answer["kill"]} == {(stale.pk, 1), (99999, 0)}
    assert lost_job.tasks.get().state == TaskState.LOST  # running here, not reported
    assert killed_job.tasks.get().state == TaskState.KILLED  # never started, kill asked
    assert answer["start"] == []


def test_it_asks_the_agent_to_kill_a_task_the_server_wants_stopped(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    running = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    beat(token, running)
    Task.objects.filter(pk=task.pk).update(kill_requested=True)
    (kill,) = beat(token, running).json()["kill"]
    assert kill["id"] == task.pk and kill["grace_seconds"] >= 0
    assert Allocation.objects.filter(task=task).exists()  # held until confirmed
    beat(token, [{"id": task.pk, "attempt": 0, "state": "Killed", "exit_code": 143}])
    assert not Allocation.objects.filter(task=task).exists()


def test_a_node_comes_back_ready_with_its_heartbeat():
    token = register().json()["token"]
    Node.objects.update(state=NodeState.NOT_READY, last_heartbeat=timezone.now())
    beat(token)
    assert Node.objects.get().state == NodeState.READY


def test_log_chunks_are_stored_once_and_capped(owner, settings):
    settings.BERTH_LOG_MAX_BYTES = 1024
    settings.BERTH_LOG_CHUNK_BYTES = 2048
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    url = f"/api/v1/agent/tasks/{task.pk}/log/"
    first = agent(token).post(url, {"attempt": 0, "offset": 0, "data": "a" * 1000}, format="json")
    assert first.json() == {"next_offset": 1000}
    agent(token).post(url, {"attempt": 0, "offset": 0, "data": "a" * 1000}, format="json")
    assert TaskLog.objects.count() == 1  # a re-sent chunk is ignored
    agent(token).post(url, {"attempt": 0, "offset": 1000, "data": "b" * 100}, format="json")
    agent(token).post(url, {"attempt": 0, "offset": 1100, "data": "c" * 100}, format="json")
    data = "".join(TaskLog.objects.order_by("offset").values_list("data", flat=True))
    assert data.startswith("a" * 1000) and "output truncated" in data and "c" * 100 not in data
    too_big = agent(token).post(url, {"attempt": 0, "offset": 0, "data": "x" * 3000}, format="json")
    assert too_big.status_code == 400 and "data" in too_big.json()
