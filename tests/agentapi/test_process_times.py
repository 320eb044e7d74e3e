"""A task's start and end are its process's times as the agent saw them, not the arrival time
of the report that carried them; absurd times are not believed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from scheduler.models import Node, Task, UsageRecord
from scheduler.states.names import TaskState
from tests.agentapi.test_protocol import _assigned, beat, join_token, register  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(owner):
    """A registered node's token and a task assigned to it ten minutes ago."""
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get(name="gpu-01"))
    assigned = timezone.now() - timedelta(minutes=10)
    Task.objects.filter(pk=task.pk).update(assigned_at=assigned)
    return token, task.pk, assigned


def report(task_id: int, state: str = "Succeeded", **times: object) -> dict[str, object]:
    return {"id": task_id, "attempt": 0, "state": state, "exit_code": 0, "message": "",
            "output_bytes": 0, **times}  # fmt: skip


def unix(when: datetime) -> float:
    return when.timestamp()


def times(task_id: int) -> tuple[datetime, datetime]:
    """The stored start and end of an ended task."""
    task = Task.objects.get(pk=task_id)
    assert task.started_at is not None and task.finished_at is not None
    return task.started_at, task.finished_at


def test_the_agents_process_start_and_end_are_stored(placed):
    token, task_id, assigned = placed
    started, ended = assigned + timedelta(seconds=5), assigned + timedelta(minutes=3)
    answer = beat(token, [report(task_id, "Running", started_at=unix(started))])
    assert answer.status_code == 200, answer.content
    task = Task.objects.get(pk=task_id)
    assert task.state == TaskState.RUNNING
    assert abs(task.started_at - started) < timedelta(milliseconds=1)

    answer = beat(token, [report(task_id, started_at=unix(started), ended_at=unix(ended))])
    assert answer.status_code == 200, answer.content
    task = Task.objects.get(pk=task_id)
    assert task.state == TaskState.SUCCEEDED
    assert abs(task.finished_at - ended) < timedelta(milliseconds=1)
    usage = UsageRecord.objects.get(task_id=task_id)  # accounting uses the same times
    assert round(usage.wall_seconds) == 175


def test_a_task_that_started_and_ended_between_two_reports_keeps_both_times(placed):
    token, task_id, assigned = placed
    started, ended = assigned + timedelta(seconds=1), assigned + timedelta(seconds=2)
    beat(token, [report(task_id, started_at=unix(started), ended_at=unix(ended))])
    task = Task.objects.get(pk=task_id)
    assert abs(task.started_at - started) < timedelta(milliseconds=1)
    assert abs(task.finished_at - ended) < timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (timedelta(days=365), timedelta(days=366)),  # a clock a year ahead
        (timedelta(hours=-5), timedelta(hours=-4)),  # long before the task was assigned
    ],
)
def test_absurd_times_are_replaced_by_the_servers(placed, start, end):
    token, task_id, assigned = placed
    now = timezone.now()
    beat(token, [report(task_id, started_at=unix(now + start), ended_at=unix(now + end))])
    started, finished = times(task_id)
    after = timezone.now()
    assert now - timedelta(seconds=1) <= started <= after
    assert started <= finished <= after


def test_times_within_the_clock_skew_are_clamped_to_assigned_and_now(placed):
    token, task_id, assigned = placed
    early = assigned - timedelta(seconds=20)  # the agent's clock is a little behind
    late = timezone.now() + timedelta(seconds=20)  # or a little ahead
    beat(token, [report(task_id, started_at=unix(early), ended_at=unix(late))])
    started, finished = times(task_id)
    assert started == Task.objects.get(pk=task_id).assigned_at
    assert finished <= timezone.now()


def test_an_end_before_the_start_is_not_believed(placed):
    token, task_id, assigned = placed
    started = assigned + timedelta(minutes=5)
    beat(token, [report(task_id, started_at=unix(started),
                        ended_at=unix(started - timedelta(seconds=30)))])  # fmt: skip
    started, finished = times(task_id)
    assert finished == started  # clamped to its start


@pytest.mark.parametrize("bad", ["yesterday", True, -1, 2**41, [1]])
def test_a_time_that_is_not_a_unix_time_is_400_naming_it(placed, bad):
    token, task_id, _ = placed
    answer = beat(token, [report(task_id, "Running", started_at=bad)])
    assert answer.status_code == 400
    assert "tasks.0.started_at" in answer.json()
    assert Task.objects.get(pk=task_id).state == TaskState.ASSIGNED


def test_without_times_the_report_time_is_kept_as_before(placed):
    token, task_id, _ = placed
    before = datetime.now(UTC)
    beat(token, [report(task_id)])
    started, finished = times(task_id)
    assert before <= started <= finished <= timezone.now()
