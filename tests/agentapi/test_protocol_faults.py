"""The server's side of faults in the agent protocol: a task an agent stopped because it was
cut off is Lost under the job's retry policy, accounted once; a node whose disk is full says
so and gets no new task; a new leader judges no node's silence before it could hear it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.cycle import leader
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.lifecycle import check_nodes, sync_jobs
from scheduler.models import Job, Node, Task, UsageRecord
from scheduler.states.names import JobState, NodeState, TaskState
from tests.agentapi.test_protocol import NODE, beat, register
from tests.factories import make_job, place

pytestmark = pytest.mark.django_db
JOIN = "join-secret"


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def _running(owner, node, max_retry=1):
    job = make_job(owner, "fenced", gpu=0, command="sleep 60", max_retry=max_retry)
    place(job, node, state=TaskState.RUNNING, devices=0)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    return job, job.tasks.get()


def test_a_task_its_agent_stopped_when_cut_off_is_lost_and_retried_once(owner):
    token = register().json()["token"]
    node = Node.objects.get(name=NODE["name"])
    job, task = _running(owner, node)
    lost = {"id": task.pk, "attempt": 0, "state": "Lost", "exit_code": 143, "output_bytes": 0,
            "message": "cut off from the server for 3.6s (node lease 6s): stopped before its"
                       " node is declared lost"}  # fmt: skip
    assert beat(token, [lost]).status_code == 200
    task.refresh_from_db()
    assert task.state == TaskState.LOST and "cut off" in task.message
    sync_jobs()
    job.refresh_from_db()
    assert (job.state, job.retries) == (JobState.PENDING, 1), job.message  # as node loss
    assert beat(token, [lost]).status_code == 200  # the same report again (a lost answer)
    assert UsageRecord.objects.filter(task_id=task.pk).count() == 1  # accounted once


def test_pressure_must_be_short_text(owner):
    token = register().json()["token"]
    answer = beat(token, [], usage={"pressure": "x" * 201})
    assert answer.status_code == 400 and "usage.pressure" in answer.json()
    assert beat(token, [], usage={"pressure": ["full"]}).status_code == 400


def test_a_node_whose_disk_is_full_gets_no_new_task_and_says_why(owner):
    token = register().json()["token"]
    why = "disk full: /var/lib/berth has 3 MiB free, under 256 MiB"
    assert beat(token, [], usage={"load": 0.1, "tasks": 0, "pressure": why}).status_code == 200
    job = make_job(owner, "waits", gpu=0, command="true")
    run_scheduler_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert "disk full" in job.pending_message  # 0/1 nodes fit: 1 disk full
    node = Node.objects.get(name=NODE["name"])
    assert node.state == NodeState.READY and node.usage["pressure"] == why
    assert beat(token, [], usage={"load": 0.1, "tasks": 0}).status_code == 200  # freed
    run_scheduler_cycle()
    assert Task.objects.get(job=job).state == TaskState.ASSIGNED


def test_a_new_leader_judges_no_node_before_a_whole_timeout(owner, settings):
    settings.BERTH_HEARTBEAT_TIMEOUT = 5.0
    register()
    node = Node.objects.get(name=NODE["name"])
    _running(owner, node)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    leader.took_lead()  # just became leader (a restart, or back after the database was out)
    try:
        assert check_nodes() == 0
        assert Node.objects.get(pk=node.pk).state == NodeState.READY
        leader._led_since[:] = [leader._led_since[0] - 5.0]  # led for a whole timeout
        assert check_nodes() == 1
        assert Node.objects.get(pk=node.pk).state == NodeState.NOT_READY
    finally:
        leader.lead_with(None)


def test_pressure_must_be_printable_and_not_empty(owner):
    token = register().json()["token"]
    for bad in ("", "full\x1b[2J", "disk\x00full"):
        answer = beat(token, [], usage={"pressure": bad})
        assert answer.status_code == 400 and "usage.pressure" in answer.json(), bad


def test_a_report_never_moves_the_lease_back_in_time(owner):
    token = register().json()["token"]
    later = timezone.now() + timedelta(seconds=30)  # renewed by a lease since the report began
    Node.objects.filter(name=NODE["name"]).update(last_heartbeat=later)
    assert beat(token, [], usage={"load": 1.0, "tasks": 0}).status_code == 200  # usage changed
    node = Node.objects.get(name=NODE["name"])
    assert node.last_heartbeat == later and node.usage["load"] == 1.0
