"""The plan phase of the scheduler loop: positions and estimates are stored, shown by the API,
and written only when they change."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Allocation, Job, Task
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy(owner):
    """One 2-GPU node held for 600 s; three jobs wait for it, oldest first."""
    node = make_node("gpu-1", gpus=2)
    running = make_job(owner, "running", gpu=2, walltime=600)
    place(running, node, devices=2)
    waiting = [
        make_job(owner, "a", gpu=2, walltime=300),
        make_job(owner, "b", gpu=1, walltime=100),
        make_job(owner, "c", gpu=1),  # no walltime
    ]
    return running, waiting


def _started(job: Job) -> datetime:
    started = Task.objects.get(job=job).started_at
    assert started is not None
    return started


def test_positions_and_estimates_are_stored_and_shown(api, owner, busy):
    running, (a, b, c) = busy
    report = run_scheduler_cycle()
    assert report.counts["planned"] == 3 and "plan" in report.phases
    frees = _started(running) + timedelta(seconds=600)
    rows = {j.name: j for j in Job.objects.filter(pk__in=[a.pk, b.pk, c.pk])}
    assert [rows[n].queue_position for n in "abc"] == [1, 2, 3]
    expected = {
        "a": frees,
        "b": frees + timedelta(seconds=300),
        "c": frees + timedelta(seconds=300),
    }
    for name, when in expected.items():
        assert abs((rows[name].estimated_start_at - when).total_seconds()) < 1, name
    body = api(owner).get(f"/api/v1/jobs/{b.pk}/").json()
    assert body["queue_position"] == 2 and body["estimated_start_at"] is not None
    listed = {j["name"]: j for j in api(owner).get("/api/v1/jobs/").json()["results"]}
    assert listed["running"]["queue_position"] is None
    assert listed["c"]["queue_position"] == 3


def test_nothing_is_written_again_when_nothing_changed(owner, busy):
    run_scheduler_cycle()
    report = run_scheduler_cycle()
    assert report.counts["plan_changed"] == 0
    assert report.phases["plan"].queries == 1  # reading the stored positions, no write


def test_positions_move_up_when_a_job_leaves_the_queue(owner, busy):
    running, (a, b, c) = busy
    run_scheduler_cycle()
    Job.objects.filter(pk=a.pk).update(state=JobState.CANCELLED)
    report = run_scheduler_cycle()
    assert report.counts["plan_changed"] == 3  # a leaves, b and c move up
    positions = dict(Job.objects.values_list("name", "queue_position"))
    assert positions == {"running": None, "a": None, "b": 1, "c": 2}
    b.refresh_from_db()
    frees = _started(running) + timedelta(seconds=600)
    assert abs((b.estimated_start_at - frees).total_seconds()) < 1


def test_a_placed_job_loses_its_position(owner, busy):
    running, (a, b, c) = busy
    run_scheduler_cycle()
    Job.objects.filter(pk=running.pk).update(state=JobState.SUCCEEDED)
    Task.objects.filter(job=running).update(state="Succeeded")
    Allocation.objects.filter(task__job=running).delete()
    run_scheduler_cycle()
    a.refresh_from_db()
    assert a.queue_position is None and a.estimated_start_at is None
    assert Job.objects.get(pk=b.pk).queue_position == 1


def test_between_full_plans_positions_move_and_estimates_are_kept(settings, owner, busy):
    """A full plan is made at most every BERTH_PLAN_INTERVAL seconds; in between a cycle only
    recomputes positions, and a waiting job keeps the estimate the last plan gave it."""
    running, (a, b, c) = busy
    run_scheduler_cycle()
    b.refresh_from_db()
    planned = b.estimated_start_at
    settings.BERTH_PLAN_INTERVAL = 3600
    Job.objects.filter(pk=a.pk).update(state=JobState.CANCELLED)
    run_scheduler_cycle()
    b.refresh_from_db()
    assert b.queue_position == 1  # moved up at once
    assert b.estimated_start_at == planned  # not re-planned yet: a full plan would move it
    settings.BERTH_PLAN_INTERVAL = 0
    run_scheduler_cycle()
    b.refresh_from_db()
    frees = _started(running) + timedelta(seconds=600)
    assert abs((b.estimated_start_at - frees).total_seconds()) < 1
