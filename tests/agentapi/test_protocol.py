"""The agent protocol over HTTP: register, report, lease, log upload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler.agent.client import PROTOCOL as CURRENT
from scheduler.models import Allocation, Device, Event, Job, Node, Task, TaskLog
from scheduler.states.names import NodeState, TaskState
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db
JOIN = "join-secret"
NODE = {"name": "gpu-01", "cpu": "8", "memory": "64Gi", "labels": {"gpu-model": "h100"},
        "devices": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}],
        "hostname": "gpu-01.lab"}  # fmt: skip


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


PROTOCOL = {"HTTP_BERTH_AGENT_PROTOCOL": str(CURRENT)}


def register(body=NODE, token=JOIN, scheme="Bearer", **headers):
    client = APIClient()
    headers = {"HTTP_AUTHORIZATION": f"{scheme} {token}", **PROTOCOL, **headers}
    return client.post("/api/v1/agent/register/", body, format="json", **headers)


def agent(token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {token}", **PROTOCOL)
    return client


def beat(token, tasks=(), **extra):
    """A full-state report."""
    return agent(token).post("/api/v1/agent/report/", {"tasks": list(tasks), **extra},
                             format="json")  # fmt: skip


def lease(token, tasks=(), wait=0):
    return agent(token).post("/api/v1/agent/lease/", {"tasks": list(tasks), "wait": wait},
                             format="json")  # fmt: skip


def upload(token, task_id, offset, data, attempt=0):
    return agent(token).post(f"/api/v1/agent/tasks/{task_id}/log/",
                             {"attempt": attempt, "offset": offset, "data": data},
                             format="json")  # fmt: skip


def rows() -> dict[str, list[Any]]:
    """Everything a report could change, to compare before and after a rejected one."""
    return {
        "tasks": list(Task.objects.order_by("pk").values()),
        "allocations": list(Allocation.objects.order_by("pk").values()),
        "events": list(Event.objects.order_by("pk").values()),
        "nodes": list(Node.objects.order_by("pk").values()),
        "jobs": list(Job.objects.order_by("pk").values()),
        "logs": list(TaskLog.objects.order_by("pk").values()),
    }


def _assigned(owner, node, gpu=1, name="job"):
    job = make_job(owner, name, gpu=gpu, command="echo hi")
    place(job, node, state=TaskState.ASSIGNED, devices=gpu)
    return job, job.tasks.get()


# --- register ----------------------------------------------------------------------------


def test_it_registers_a_node_with_its_devices():
    response = register()
    assert response.status_code == 201
    answer = response.json()
    node = Node.objects.get(name="gpu-01")
    assert (node.cpu, node.memory, node.labels) == (8000, 64 * 2**30, {"gpu-model": "h100"})
    assert (node.hostname, node.state, node.last_heartbeat is not None) == (
        "gpu-01.lab", NodeState.READY, True)  # fmt: skip
    assert list(node.devices.values_list("index", "uuid")) == [(0, "GPU-a"), (1, "GPU-b")]
    assert node.token_hash and answer["token"] not in node.token_hash
    assert {"node", "token", "lease_seconds", "kill_grace_seconds", "protocol"} <= set(answer)
    assert Event.objects.filter(kind="NodeRegistered", node=node).exists()


def test_it_says_where_a_node_registered_from():
    token = register(REMOTE_ADDR="10.232.9.2").json()["token"]
    register(token=token, scheme="Node", REMOTE_ADDR="10.232.9.3")  # the agent moved
    events = Event.objects.filter(kind="NodeRegistered", node__name="gpu-01").order_by("pk")
    assert [e.message.rsplit(" ", 2)[-2:] for e in events] == [
        ["from", "10.232.9.2"], ["from", "10.232.9.3"]]  # fmt: skip


@pytest.mark.parametrize("token", ["", "wrong", "jöin-secret"])
def test_it_refuses_a_wrong_join_token(token):
    assert register(token=token).status_code == 401
    assert not Node.objects.exists()


def test_it_refuses_registration_without_a_join_token_configured(settings):
    settings.BERTH_JOIN_TOKEN = ""
    response = register()
    assert response.status_code == 403 and "BERTH_JOIN_TOKEN" in response.json()["detail"]
    assert not Node.objects.exists()


def test_it_names_bad_registration_fields():
    response = register({"name": "Bad Name", "cpu": -1, "memory": "lots",
                         "devices": [{"x": 1}, {"index": 1, "memory": "big"}]})  # fmt: skip
    assert response.status_code == 400
    assert {"name", "cpu", "memory", "devices.0", "devices.1.memory"} <= set(response.json())
    assert not Node.objects.exists()


@pytest.mark.parametrize(("cpu", "millicores"), [(8000, 8000), ("8", 8000), ("500m", 500)])
def test_it_reads_cpu_as_millicores_or_as_users_write_it(cpu, millicores):
    assert register({**NODE, "cpu": cpu}).status_code == 201
    assert Node.objects.get().cpu == millicores


def test_it_reconciles_devices_when_a_node_registers_again_with_its_own_token(owner):
    token = register().json()["token"]
    _assigned(owner, Node.objects.get())  # holds device 0
    body = {**NODE, "labels": {}, "devices": [{"index": 2, "uuid": "GPU-c"}]}
    again = register(body, token=token, scheme="Node")
    assert again.status_code == 200 and again.json()["token"] == token
    devices = {d.index: d for d in Device.objects.all()}
    # Device 0 is gone from the machine but held by a task: kept, unhealthy. Device 1 is
    # gone and free: deleted. Device 2 is new.
    assert set(devices) == {0, 2} and not devices[0].healthy and devices[2].uuid == "GPU-c"
    assert Node.objects.get().labels == {}
    assert beat(token).status_code == 200


# --- heartbeat ---------------------------------------------------------------------------


def test_it_starts_assigned_tasks_with_their_env_and_follows_them_to_the_end(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    answer = beat(token).json()
    (start,) = answer["start"]
    assert (start["id"], start["attempt"], start["command"], start["devices"]) == (
        task.pk, 0, "echo hi", [0])  # fmt: skip
    assert (start["job_id"], start["group"], start["index"]) == (job.pk, "main", 0)
    env = start["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert (env["BERTH_JOB_ID"], env["BERTH_TASK_INDEX"]) == (str(job.pk), "0")
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "1", "gpu-01.lab")
    assert env["MASTER_PORT"] == str(20000 + job.pk % 20000)
    assert answer["kill"] == [] and answer["lease_seconds"] > 0

    running = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    beat(token, running)
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING and task.started_at
    assert Event.objects.filter(kind="TaskStarted", job=job).count() == 1
    # The same report again: no new start message, no change, no new event.
    before = rows()
    assert beat(token, running).json() == {**answer, "start": []}
    after = rows()
    for table in ("tasks", "allocations", "events", "jobs"):
        assert before[table] == after[table]

    done = [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0, "output_bytes": 0}]
    beat(token, done)
    task.refresh_from_db()
    assert (task.state, task.exit_code, task.finished_at is not None) == (
        TaskState.SUCCEEDED, 0, True)  # fmt: skip
    assert not Allocation.objects.exists()  # the device is free once the agent confirms
    # A retried report changes nothing more.
    before = rows()
    retried = beat(token, done)
    assert retried.status_code == 200 and retried.json()["kill"] == []
    assert rows()["events"] == before["events"] and rows()["tasks"] == before["tasks"]


def test_it_gives_each_task_of_a_gang_its_rank_and_devices(owner):
    token_a = register().json()["token"]
    token_b = register({**NODE, "name": "gpu-02", "hostname": "gpu-02.lab"}).json()["token"]
    node_a, node_b = Node.objects.get(name="gpu-01"), Node.objects.get(name="gpu-02")
    job = make_job(owner, replicas=2, gpu=1, command="train")
    job.spec["tasks"][0]["env"] = {"LR": "0.1"}
    job.save()
    first, second = job.tasks.order_by("index")
    for task, node, device in ((first, node_a, 0), (second, node_b, 1)):
        Task.objects.filter(pk=task.pk).update(state=TaskState.ASSIGNED, node=node)
        Allocation.objects.create(task=task, device=node.devices.get(index=device))
    (start,) = beat(token_b).json()["start"]
    env = start["env"]
    assert start["id"] == second.pk and env["LR"] == "0.1"
    assert (env["RANK"], env["BERTH_TASK_INDEX"], env["WORLD_SIZE"]) == ("1", "1", "2")
    assert env["MASTER_ADDR"] == "gpu-01.lab"  # where rank 0 runs
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and start["devices"] == [1]
    assert beat(token_a).json()["start"][0]["env"]["RANK"] == "0"


def test_it_gives_a_task_without_devices_an_empty_cuda_visible_devices(owner):
    token = register().json()["token"]
    _assigned(owner, Node.objects.get(), gpu=0)
    (start,) = beat(token).json()["start"]
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == "" and start["devices"] == []


def test_it_finishes_a_task_that_ran_and_ended_between_two_heartbeats(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    failed = [
        {
            "id": task.pk,
            "attempt": 0,
            "state": "Failed",
            "exit_code": 3,
            "output_bytes": 0,
            "message": "x",
        }
    ]
    assert beat(token, failed).json()["start"] == []
    task.refresh_from_db()
    assert (task.state, task.exit_code) == (TaskState.FAILED, 3)
    assert task.started_at and task.finished_at
    assert not Allocation.objects.exists()
    event = Event.objects.get(kind="TaskFailed", job=job)
    assert "code 3" in event.message
    job.refresh_from_db()
    assert job.state == "Pending"  # job states are the scheduler loop's business


@pytest.mark.parametrize(
    "tasks",
    [
        [{"id": "x", "attempt": 0, "state": "Running"}],
        [{"id": 1, "attempt": 0, "state": "Exploded"}],
        [{"id": 1, "attempt": -1, "state": "Running"}],
        [{"id": 1, "attempt": "0", "state": "Running"}],
        [{"id": 1, "attempt": 0, "state": "Failed"}],  # a failure needs its exit code
        [{"id": 1, "attempt": 0, "state": "Failed", "exit_code": "3", "output_bytes": 0}],
        [{"id": 1, "attempt": 0, "state": "Running"}, {"id": 1, "attempt": 0, "state": "Running"}],
        ["not an object"],
        "not a list",
    ],
)
def test_it_rejects_a_malformed_report_and_changes_nothing(owner, tasks):
    token = register().json()["token"]
    node = Node.objects.get()
    _, task = _assigned(owner, node)
    lost_job = make_job(owner, "lost")
    place(lost_job, node, state=TaskState.RUNNING)  # would become Lost if the report applied
    Node.objects.update(state=NodeState.NOT_READY)
    good = {"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0, "output_bytes": 0}
    before = rows()
    response = beat(token, [good, *tasks] if isinstance(tasks, list) else tasks)
    assert response.status_code == 400
    assert rows() == before  # not the good part either, nor the node's heartbeat


def test_it_rejects_a_report_with_usage_that_is_not_an_object():
    token = register().json()["token"]
    before = rows()
    assert beat(token, usage="lots").status_code == 400
    assert rows() == before
    assert beat(token, usage={"load": 0.5}).status_code == 200
    assert Node.objects.get().usage == {"load": 0.5}


def test_it_lets_a_node_token_act_only_for_its_own_node(owner):
    mine = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    _, theirs = _assigned(owner, Node.objects.get(name="gpu-02"))
    before = rows()
    response = beat(
        mine,
        [{"id": theirs.pk, "attempt": 0, "state": "Failed", "exit_code": 1, "output_bytes": 0}],
    )
    assert response.status_code == 400 and "gpu-01" in str(response.json())
    assert rows() == before
    log = upload(mine, theirs.pk, 0, "x")
    assert log.status_code == 404 and not TaskLog.objects.exists()
    assert beat("not-a-token").status_code == 401
    assert agent("").post("/api/v1/agent/report/", {}, format="json").status_code == 401
    assert lease("not-a-token").status_code == 401
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {JOIN}", **PROTOCOL)  # not a node's token
    assert bearer.post("/api/v1/agent/report/", {}, format="json").status_code == 401


def test_it_kills_an_old_attempt_of_a_task_that_moved_to_another_node(owner):
    # Node A went silent, its task was lost and now runs again, as attempt 1, on node B;
    # node A comes back still running attempt 0.
    token_a = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    job = make_job(owner)
    place(job, Node.objects.get(name="gpu-02"), state=TaskState.RUNNING)
    task = job.tasks.get()
    Task.objects.filter(pk=task.pk).update(attempt=1)
    before = rows()["tasks"]
    answer = beat(token_a, [{"id": task.pk, "attempt": 0, "state": "Running"}]).json()
    assert [(k["id"], k["attempt"]) for k in answer["kill"]] == [(task.pk, 0)]
    assert rows()["tasks"] == before


def test_it_reconciles_what_the_agent_runs_with_what_the_server_wants(owner):
    token = register().json()["token"]
    node = Node.objects.get()
    lost_job = make_job(owner, "lost")
    place(lost_job, node, state=TaskState.RUNNING, devices=1)
    killed_job, killed = _assigned(owner, node, name="killed")
    Task.objects.filter(pk=killed.pk).update(kill_requested=True)
    # The agent runs a stale attempt of a task, a task the server never heard of, and a task
    # the server already considers over.
    stale_job = make_job(owner, "stale")
    place(stale_job, node, state=TaskState.RUNNING)
    stale = stale_job.tasks.get()
    Task.objects.filter(pk=stale.pk).update(attempt=2)
    over_job = make_job(owner, "over")
    place(over_job, node, state=TaskState.RUNNING)
    over = over_job.tasks.get()
    Task.objects.filter(pk=over.pk).update(state=TaskState.LOST)
    answer = beat(token, [{"id": stale.pk, "attempt": 1, "state": "Running"},
                          {"id": 99999, "attempt": 0, "state": "Running"},
                          {"id": over.pk, "attempt": 0, "state": "Running"},
                          {"id": stale.pk + 1000, "attempt": 0, "state": "Succeeded",
                           "exit_code": 0, "output_bytes": 0}]).json()  # fmt: skip
    # The never-started task whose kill was asked is in the kill orders too: its start may be
    # on its way in a lease answer, so only the agent's word frees its devices.
    assert {(k["id"], k["attempt"]) for k in answer["kill"]} == {
        (stale.pk, 1), (99999, 0), (over.pk, 0), (killed.pk, 0)}  # fmt: skip
    lost = lost_job.tasks.get()
    assert (lost.state, lost.message) == (TaskState.LOST, "agent no longer runs it")
    assert not Allocation.objects.filter(task=lost).exists()
    assert Event.objects.filter(kind="TaskLost", job=lost_job).exists()
    assert killed_job.tasks.get().state == TaskState.ASSIGNED
    assert Allocation.objects.filter(task=killed).exists()
    assert stale_job.tasks.get().state == TaskState.LOST  # attempt 2 is not running there
    assert answer["start"] == []
    # Repeating the report changes nothing more.
    before = rows()
    again = beat(token, [{"id": stale.pk, "attempt": 1, "state": "Running"}]).json()
    assert again["kill"] == [k for k in answer["kill"] if k["id"] in (stale.pk, killed.pk)]
    assert rows()["tasks"] == before["tasks"] and rows()["events"] == before["events"]
    # The agent confirms it never ran it: now it is Killed and its device free.
    never = {"id": killed.pk, "attempt": 0, "state": "Killed", "exit_code": None,
             "output_bytes": 0, "message": "stopped before it started"}  # fmt: skip
    assert beat(token, [never]).json()["kill"] == []
    task = killed_job.tasks.get()
    assert (task.state, task.started_at) == (TaskState.KILLED, None)
    assert not Allocation.objects.filter(task=killed).exists()


def test_it_asks_the_agent_to_kill_a_task_the_server_wants_stopped(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    running = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    beat(token, running)
    Task.objects.filter(pk=task.pk).update(kill_requested=True)
    answer = beat(token, running).json()
    (kill,) = answer["kill"]
    assert kill["id"] == task.pk and kill["attempt"] == 0 and kill["grace_seconds"] >= 0
    assert answer["start"] == []
    assert Allocation.objects.filter(task=task).exists()  # held until confirmed
    beat(
        token,
        [{"id": task.pk, "attempt": 0, "state": "Killed", "exit_code": 143, "output_bytes": 0}],
    )
    task.refresh_from_db()
    assert (task.state, task.exit_code) == (TaskState.KILLED, 143)
    assert not Allocation.objects.filter(task=task).exists()


def test_it_does_not_start_an_assigned_task_whose_kill_was_requested(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    Task.objects.filter(pk=task.pk).update(kill_requested=True)
    # The agent got the start message before the kill request: it reports it running.
    answer = beat(token, [{"id": task.pk, "attempt": 0, "state": "Running"}]).json()
    assert [k["id"] for k in answer["kill"]] == [task.pk] and answer["start"] == []


def test_it_brings_a_node_back_ready_with_its_heartbeat():
    token = register().json()["token"]
    Node.objects.update(state=NodeState.NOT_READY, last_heartbeat=timezone.now())
    beat(token)
    node = Node.objects.get()
    assert node.state == NodeState.READY
    assert Event.objects.filter(kind="NodeReady", node=node).exists()


def test_it_keeps_a_cordoned_node_cordoned_when_it_comes_back():
    token = register().json()["token"]
    Node.objects.update(state=NodeState.NOT_READY, admin_state=NodeState.CORDONED)
    beat(token)
    assert Node.objects.get().state == NodeState.CORDONED


# --- logs --------------------------------------------------------------------------------


def test_it_stores_log_chunks_once_and_caps_them(owner, settings):
    settings.BERTH_LOG_MAX_BYTES = 1024
    settings.BERTH_LOG_CHUNK_BYTES = 2048
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    assert upload(token, task.pk, 0, "a" * 1000).json() == {"next_offset": 1000}
    assert upload(token, task.pk, 0, "a" * 1000).status_code == 200
    assert TaskLog.objects.count() == 1  # a re-sent chunk is ignored
    upload(token, task.pk, 1000, "b" * 100)
    upload(token, task.pk, 1100, "c" * 100)
    data = "".join(TaskLog.objects.order_by("offset").values_list("data", flat=True))
    # What fits is kept, then one marker, then nothing.
    assert data.startswith("a" * 1000 + "b" * 24) and "b" * 25 not in data
    assert data.count("output truncated") == 1 and "cc" not in data
    too_big = upload(token, task.pk, 1200, "x" * 3000)
    assert too_big.status_code == 400 and "data" in too_big.json()


def test_it_keeps_each_attempts_output_apart(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    upload(token, task.pk, 0, "first\n", attempt=0)
    upload(token, task.pk, 0, "second\n", attempt=1)
    assert list(TaskLog.objects.order_by("attempt").values_list("attempt", "data")) == [
        (0, "first\n"), (1, "second\n")]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"),
    [({"offset": 0, "data": "x"}, "attempt"), ({"attempt": 0, "offset": -1, "data": "x"}, "offset"),
     ({"attempt": 0, "offset": 0, "data": 5}, "data")],
)  # fmt: skip
def test_it_names_bad_log_fields(owner, body, field):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    response = agent(token).post(f"/api/v1/agent/tasks/{task.pk}/log/", body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not TaskLog.objects.exists()


def test_it_pushes_new_output_live_after_commit(owner, monkeypatch,
                                                django_capture_on_commit_callbacks):  # fmt: skip
    from scheduler import notify

    pushed: list[tuple[Any, ...]] = []
    changed: list[set[int]] = []
    # The listeners notify hands changes to, in place of the dashboard's renderers.
    monkeypatch.setattr(notify, "_log_listeners", [lambda *a: pushed.append(a)])
    monkeypatch.setattr(notify, "_change_listeners", [lambda jobs, *_: changed.append(jobs)])
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    with django_capture_on_commit_callbacks(execute=True):
        upload(token, task.pk, 0, "hello\n")
    with django_capture_on_commit_callbacks(execute=True):
        upload(token, task.pk, 0, "hello\n")  # a duplicate is not pushed again
    assert pushed == [(task.pk, 0, 0, "hello\n")]
    assert changed == [{job.pk}]


# --- protocol version --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "got"),
    [
        ({}, "1"),
        ({"HTTP_BERTH_AGENT_PROTOCOL": "2"}, "2"),
        ({"HTTP_BERTH_AGENT_PROTOCOL": "4"}, "4"),
    ],
)
def test_it_refuses_an_agent_of_another_protocol_at_registration(headers, got):
    client = APIClient()
    body = {**NODE, "version": "berth-agent/1"}
    headers = {"HTTP_AUTHORIZATION": f"Bearer {JOIN}", **headers}
    response = client.post("/api/v1/agent/register/", body, format="json", **headers)
    assert response.status_code == 426
    assert response.json()["detail"] == [
        f"agent protocol {CURRENT} required, got {got}; upgrade the agent"]  # fmt: skip
    assert response["Upgrade"] == f"berth-agent/{CURRENT}"
    assert not Node.objects.exists()


@pytest.mark.parametrize("path", ["heartbeat/", "report/", "lease/", "tasks/1/log/"])
def test_it_refuses_an_old_agent_on_every_call_and_changes_nothing(owner, path):
    token = register().json()["token"]
    _assigned(owner, Node.objects.get())
    Node.objects.update(state=NodeState.NOT_READY)
    before = rows()
    old = APIClient()  # protocol 1 sent no version header
    old.credentials(HTTP_AUTHORIZATION=f"Node {token}")
    response = old.post(f"/api/v1/agent/{path}", {"tasks": []}, format="json")
    assert response.status_code == 426
    assert f"agent protocol {CURRENT} required, got none; upgrade the agent" in str(response.json())
    assert rows() == before


# --- output before success ---------------------------------------------------------------


def test_a_task_ends_only_once_its_output_is_all_here(owner):
    from scheduler.lifecycle import sync_jobs

    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    beat(token, [{"id": task.pk, "attempt": 0, "state": "Running"}])
    upload(token, task.pk, 0, "first line\n")
    # The final report overtakes the last chunk of output.
    done = [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0,
             "output_bytes": len("first line\nlast line\n")}]  # fmt: skip
    answer = beat(token, done).json()
    assert answer["awaiting_output"] == [
        {"id": task.pk, "attempt": 0, "have": 11, "want": 21}]  # fmt: skip
    sync_jobs()
    task.refresh_from_db()
    job.refresh_from_db()
    assert (task.state, job.state) == (TaskState.RUNNING, "Running")
    assert Allocation.objects.filter(task=task).exists()
    # The chunk arrives; the agent reports again (it does until the end is taken).
    upload(token, task.pk, 11, "last line\n")
    assert beat(token, done).json()["awaiting_output"] == []
    sync_jobs()
    task.refresh_from_db()
    job.refresh_from_db()
    assert (task.state, job.state) == (TaskState.SUCCEEDED, "Succeeded")


def test_a_task_whose_output_hit_the_cap_ends_without_the_rest(owner, settings):
    settings.BERTH_LOG_MAX_BYTES = 1024
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    upload(token, task.pk, 0, "x" * 1000)
    upload(token, task.pk, 1000, "y" * 1000)  # over the cap: the rest is dropped
    done = [{"id": task.pk, "attempt": 0, "state": "Failed", "exit_code": 1,
             "output_bytes": 10**6}]  # fmt: skip
    assert beat(token, done).json()["awaiting_output"] == []
    task.refresh_from_db()
    assert task.state == TaskState.FAILED


def test_a_final_report_must_say_how_much_output_there_was(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    before = rows()
    for extra in ({}, {"output_bytes": -1}, {"output_bytes": "9"}, {"output_bytes": 2**70}):
        report = {"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0, **extra}
        response = beat(token, [report])
        assert response.status_code == 400 and "tasks.0.output_bytes" in response.json()
    assert rows() == before


# --- lease -------------------------------------------------------------------------------


def test_a_lease_renews_the_node_and_brings_its_orders(owner):
    token = register().json()["token"]
    node = Node.objects.get()
    job, task = _assigned(owner, node)
    running_job = make_job(owner, "running")
    place(running_job, node, state=TaskState.RUNNING)  # not in the lease body: not Lost
    Node.objects.update(state=NodeState.NOT_READY, last_heartbeat=timezone.now() - timedelta(1))
    answer = lease(token).json()
    assert [s["id"] for s in answer["start"]] == [task.pk] and answer["kill"] == []
    assert answer["start"][0]["env"]["BERTH_JOB_ID"] == str(job.pk)
    node.refresh_from_db()
    renewed = node.last_heartbeat
    assert node.state == NodeState.READY
    assert renewed is not None and renewed > timezone.now() - timedelta(seconds=60)
    assert running_job.tasks.get().state == TaskState.RUNNING
    task.refresh_from_db()
    assert task.state == TaskState.ASSIGNED  # started only once the agent says so
    # The agent knows the task now: nothing more to say (a short wait, then an empty answer).
    known = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    assert lease(token, known, wait=0.05).json()["start"] == []
    # A kill is an order too, once, and not again while the agent is stopping it.
    Task.objects.filter(pk=task.pk).update(kill_requested=True)
    assert [k["id"] for k in lease(token, known).json()["kill"]] == [task.pk]
    stopping = [{**known[0], "stopping": True}]
    assert lease(token, stopping, wait=0).json()["kill"] == []


@pytest.mark.parametrize("body", [[1], {"tasks": "x"}, {"tasks": [], "wait": -1},
                                  {"tasks": [], "wait": "long"}])  # fmt: skip
def test_a_lease_names_what_is_wrong_with_its_body(body):
    token = register().json()["token"]
    response = agent(token).post("/api/v1/agent/lease/", body, format="json")
    assert response.status_code == 400
    response = agent(token).post("/api/v1/agent/lease/", b"{nope", content_type="application/json")
    assert response.status_code == 400 and "body" in response.json()


def test_a_node_that_renews_its_lease_stays_ready_and_a_silent_one_is_lost(owner, settings):
    from scheduler.lifecycle import check_nodes

    settings.BERTH_HEARTBEAT_TIMEOUT = 42.5
    alive = register().json()["token"]
    register({**NODE, "name": "gpu-02"})
    silent_job = make_job(owner, "silent")
    place(silent_job, Node.objects.get(name="gpu-02"), state=TaskState.RUNNING)
    long_ago = timezone.now() - timedelta(seconds=43)
    Node.objects.update(last_heartbeat=long_ago)
    assert lease(alive, wait=0).status_code == 200  # a renewal at rest, nothing else
    assert check_nodes() == 1
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"gpu-01": NodeState.READY, "gpu-02": NodeState.NOT_READY}
    assert silent_job.tasks.get().state == TaskState.LOST


def test_a_lease_still_answers_when_the_channel_layer_is_down(owner, settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:9/0"]},
        }
    }  # fmt: skip  (nobody listens there)
    token = register().json()["token"]
    response = lease(token, wait=0.3)
    assert response.status_code == 200 and response.json()["start"] == []
    _, task = _assigned(owner, Node.objects.get())
    assert [s["id"] for s in lease(token, wait=0.3).json()["start"]] == [task.pk]


def test_a_lease_without_a_database_connection_is_told_to_come_back(monkeypatch):
    from django.db import OperationalError

    from scheduler.agentapi import lease as lease_module

    token = register().json()["token"]

    def no_connection(*args: Any) -> Any:
        raise OperationalError("connection pool exhausted")

    monkeypatch.setattr(lease_module, "renew_lease", no_connection)
    response = lease(token)
    assert response.status_code == 503 and response["Retry-After"] == "1"
