"""A cycle with nothing changed since the previous one is skipped: one statement, not twenty.

The change marks are PostgreSQL triggers (scheduler/migrations/0014_change_marks.py); every write
the cycle would react to must still be picked up by the very next cycle.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from scheduler.cycle.loop import CycleReport, run_scheduler_cycle, take_changes
from scheduler.models import Node, Queue, Task
from scheduler.states.names import NodeState, TaskState
from tests.cycle.loop_runner import run_loop
from tests.factories import make_job, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("change marks are kept on PostgreSQL only")


def idle() -> CycleReport:
    return run_scheduler_cycle(housekeeping=False, skip_unchanged=True)


def test_an_idle_cycle_is_one_statement(owner):
    make_node("gpu-1", gpus=2)
    make_job(owner, gpu=1)
    run_scheduler_cycle()  # places the job
    run_scheduler_cycle(housekeeping=False, skip_unchanged=True)  # its own writes: a full one
    report = idle()
    assert report.skipped
    assert report.queries == 1


def test_a_job_submitted_between_cycles_is_placed_by_the_next_one(owner):
    make_node("gpu-1", gpus=2)
    run_scheduler_cycle()
    assert idle().skipped
    job = make_job(owner, gpu=1)
    report = idle()
    assert not report.skipped
    assert Task.objects.get(job=job).state == TaskState.ASSIGNED


def test_a_task_that_ended_moves_its_job_in_the_next_cycle(owner):
    make_node("gpu-1", gpus=1)
    job = make_job(owner, gpu=1)
    run_scheduler_cycle()
    run_scheduler_cycle()
    assert idle().skipped
    Task.objects.filter(job=job).update(state=TaskState.SUCCEEDED, exit_code=0)
    assert not idle().skipped
    job.refresh_from_db()
    assert job.state == "Succeeded"


def test_lease_renewals_leave_no_mark_but_a_node_change_does(owner):
    node = make_node("gpu-1", gpus=1)
    run_scheduler_cycle()
    node.last_heartbeat = timezone.now()
    node.save(update_fields=["last_heartbeat", "state"])  # as a lease renewal saves it
    assert idle().skipped
    Node.objects.filter(pk=node.pk).update(state=NodeState.DRAINING)
    assert not idle().skipped
    node.devices.update(healthy=False)
    assert take_changes()
    Queue.objects.update(weight=3)
    assert take_changes()
    assert not take_changes()


def test_a_quiet_housekeeping_cycle_still_runs_the_clocks_checks(owner):
    from datetime import timedelta

    node = make_node("silent", gpus=1, last_heartbeat=timezone.now() - timedelta(hours=1))
    run_scheduler_cycle(housekeeping=False)
    report = run_scheduler_cycle(housekeeping=True, skip_unchanged=True)
    assert report.skipped  # nothing written: no placement, no job states
    node.refresh_from_db()
    assert node.state == NodeState.NOT_READY  # but the silent node was found
    assert not idle().skipped  # and what that changed makes the next cycle a full one


def test_the_loop_never_skips_its_first_cycle_nor_the_one_after_a_failure(monkeypatch):

    stop, calls = threading.Event(), []

    def cycle(interval: float, housekeeping: bool, skip_unchanged: bool = False) -> object:
        calls.append(skip_unchanged)
        report = CycleReport()
        if len(calls) == 2:
            report.errors.append("load")
        if len(calls) == 4:
            stop.set()
        return report

    run_loop(monkeypatch, cycle, 0.001, stop)
    assert calls == [False, True, False, True]


def test_the_loop_runs_a_full_cycle_every_few_seconds_even_when_nothing_changed(monkeypatch):
    from scheduler.cycle.loop import FULL_CYCLE_SECONDS
    from scheduler.management.commands import run_scheduler

    clock = iter(i * 0.1 for i in range(10_000))  # read twice a cycle: a cycle every 0.2 s
    real, loop_thread = time.monotonic, threading.current_thread()

    def monotonic() -> float:
        # `time` is one module for every thread: another test's leftover thread reading the
        # clock must not take this loop's ticks (it did, once, in a full CI run).
        return next(clock) if threading.current_thread() is loop_thread else real()

    monkeypatch.setattr(run_scheduler.time, "monotonic", monotonic)
    stop, calls = threading.Event(), []

    def cycle(interval: float, housekeeping: bool, skip_unchanged: bool = False) -> object:
        calls.append(skip_unchanged)
        if len(calls) == 60:
            stop.set()
        return CycleReport(skipped=skip_unchanged)  # nothing ever changes

    run_loop(monkeypatch, cycle, 0.2, stop)
    assert FULL_CYCLE_SECONDS == 5.0
    full = [i for i, skip in enumerate(calls) if not skip]
    assert full == [0, 25, 50]  # at 0, 5 and 10 s
