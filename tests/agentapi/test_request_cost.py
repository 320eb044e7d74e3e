"""What one agent request costs the database does not grow with the tasks it carries: a lease
answer with several starts, the lease confirming them and the final report ending them each
run the same statements as for one task (bench/agent_profile.py measures the time)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Allocation, Event, Node, Task, UsageRecord
from scheduler.states.names import TaskState
from tests.agentapi.test_protocol import JOIN, NODE, beat, lease, register
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def _place(owner: Any, n: int) -> list[Task]:
    node = Node.objects.get()
    tasks = []
    for i in range(n):
        job = make_job(owner, f"job-{i}", gpu=1, command="echo hi")
        place(job, node, state=TaskState.ASSIGNED, devices=1)
        tasks.append(job.tasks.get())
    return tasks


def _statements(call: Any) -> tuple[int, Any]:
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code == 200, response.content
    return len(queries), response.json()


def _one_round(owner: Any, token: str, n: int) -> list[int]:
    """Statements of: the lease carrying n starts, the lease confirming them, the report
    ending them with their output inline."""
    tasks = _place(owner, n)
    starts, answer = _statements(lambda: lease(token, wait=0))
    assert sorted(s["id"] for s in answer["start"]) == sorted(t.pk for t in tasks)
    running = [{"id": t.pk, "attempt": 0, "state": "Running"} for t in tasks]
    confirm, _ = _statements(lambda: lease(token, running, wait=0))
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.RUNNING}
    ended = [{**r, "state": "Succeeded", "exit_code": 0, "output_bytes": 3,
              "output": {"offset": 0, "data": "hi\n"}} for r in running]  # fmt: skip
    final, answer = _statements(lambda: beat(token, ended))
    assert answer["awaiting_output"] == []
    return [starts, confirm, final]


def test_a_request_runs_as_many_statements_for_four_tasks_as_for_one(owner):
    token = register({**NODE, "devices": [{"index": i} for i in range(8)]}).json()["token"]
    one = _one_round(owner, token, 1)
    Task.objects.all().delete()
    four = _one_round(owner, token, 4)
    assert four == one
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 4
    assert not Allocation.objects.exists()
    assert UsageRecord.objects.count() == 5
    assert Event.objects.filter(kind="TaskSucceeded").count() == 5
    assert Event.objects.filter(kind="TaskStarted").count() == 5


def test_starts_in_a_reports_answer_cost_the_same_statements_for_four_tasks_as_for_one(owner):
    """A report answers with the starts of the tasks placed here that it does not list: their
    jobs are read once for all of them, not column by column for each (the rows a report
    locks hold only what ending a task needs of its job)."""
    token = register({**NODE, "devices": [{"index": i} for i in range(8)]}).json()["token"]
    counts = []
    for n in (1, 4):
        Task.objects.all().delete()
        tasks = _place(owner, n)
        statements, answer = _statements(lambda: beat(token, []))
        assert sorted(s["id"] for s in answer["start"]) == sorted(t.pk for t in tasks)
        assert all(s["command"] == "echo hi" and s["job_name"] for s in answer["start"])
        counts.append(statements)
    assert counts[0] == counts[1]


def test_a_lease_renewed_less_than_a_second_ago_is_not_written_again():
    from datetime import timedelta

    from django.utils import timezone

    token = register().json()["token"]
    just_now = timezone.now() - timedelta(seconds=0.2)
    Node.objects.update(last_heartbeat=just_now)
    assert lease(token, wait=0).status_code == 200
    assert Node.objects.get().last_heartbeat == just_now
    a_while_ago = timezone.now() - timedelta(seconds=2)
    Node.objects.update(last_heartbeat=a_while_ago)
    assert lease(token, wait=0).status_code == 200
    renewed = Node.objects.get().last_heartbeat
    assert renewed is not None and renewed > a_while_ago


@pytest.mark.asyncio
async def test_held_leases_of_a_process_share_one_subscription(settings):
    from channels.layers import get_channel_layer

    from scheduler import notify

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    first, second = notify.OrdersWaiter(), notify.OrdersWaiter()
    await first.open()
    await second.open()
    assert len(layer.groups[notify.AGENT_GROUP]) == 1
    await layer.group_send(notify.AGENT_GROUP, {"type": "agent.orders", "nodes": [7]})
    assert await first.wait(7, 5.0)  # woken before it knew its node: not lost
    assert not await second.wait(8, 0.05)  # another node's orders
    await first.close()
    await second.close()


@pytest.mark.asyncio
async def test_the_shared_subscription_is_renewed_while_leases_are_held(settings, monkeypatch):
    """A process whose leases are held without a break keeps its membership of the agents'
    group fresh (the layer forgets a group member after its expiry): wake-ups keep coming."""
    import asyncio

    from channels.layers import get_channel_layer

    from scheduler import notify

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setattr(notify._Dispatcher, "REFRESH_SECONDS", 0.05)
    layer = get_channel_layer()
    joined: list[str] = []
    group_add = layer.group_add

    async def counting_group_add(group: str, channel: str) -> None:
        joined.append(channel)
        await group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", counting_group_add)
    waiter = notify.OrdersWaiter()
    await waiter.open()
    assert not await waiter.wait(7, 0.3)  # held, nothing for node 7
    await waiter.close()
    assert len(joined) >= 4  # the first join, then renewed while the lease was held
    await asyncio.sleep(0.15)
    stopped = len(joined)
    await asyncio.sleep(0.15)
    assert len(joined) == stopped  # no lease held: no renewals either


def test_a_final_report_reads_owner_and_queue_with_the_tasks_it_locks(owner):
    """The usage records of the tasks a report ends take the owner and queue from the rows
    locked with the tasks: no separate query for them."""
    token = register({**NODE, "devices": [{"index": i} for i in range(8)]}).json()["token"]
    [task] = _place(owner, 1)
    lease(token, wait=0)
    running = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    lease(token, running, wait=0)
    ended = [{**running[0], "state": "Succeeded", "exit_code": 0, "output_bytes": 0}]
    with CaptureQueriesContext(connection) as queries:
        assert beat(token, ended).status_code == 200
    job_reads = [q["sql"] for q in queries if q["sql"].startswith('SELECT "scheduler_job"')]
    assert job_reads == []
    record = UsageRecord.objects.get()
    assert (record.username, record.queue, record.user_id) == (owner.username, "default", owner.pk)
