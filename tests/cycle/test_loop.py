"""The cycle report: where a cycle's time went, phase by phase, for the log and benchmarks."""

from __future__ import annotations

import re

import pytest

from scheduler.cycle.loop import PHASES, run_scheduler_cycle
from scheduler.models import Task
from scheduler.states.names import TaskState
from tests.cycle.loop_runner import run_loop
from tests.factories import make_job, make_node

pytestmark = pytest.mark.django_db


def test_it_reports_each_phase_with_its_queries(owner):
    make_node("gpu-1", gpus=1)
    job = make_job(owner, gpu=1)

    report = run_scheduler_cycle()
    assert Task.objects.get(job=job).state == TaskState.ASSIGNED
    assert list(report.phases)[: len(PHASES)] == list(PHASES)
    assert report.phases["load"].queries >= 6
    assert report.phases["commit"].queries > 0
    assert report.phases["core"].queries == 0  # the core never touches the database
    assert report.queries == sum(t.queries for t in report.phases.values())
    assert report.total_seconds >= sum(t.seconds for t in report.phases.values()) * 0.99
    assert {*PHASES, "total"} <= set(report.durations)


def test_its_log_line_shows_every_phase_in_ms(owner):
    make_node("gpu-1", gpus=1)
    make_job(owner, gpu=1)
    line = run_scheduler_cycle().line()
    for name in (*PHASES, "total", "db"):
        assert re.search(rf" {name}=\d+\.\dms", line), (name, line)
    assert re.search(r" queries=\d+ ", line)
    assert " placed=1 " in line


def test_a_cycle_without_housekeeping_leaves_the_clocks_checks_for_later(owner):
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.models import Node
    from scheduler.states.names import NodeState

    make_node("silent", last_heartbeat=timezone.now() - timedelta(hours=1))
    run_scheduler_cycle(housekeeping=False)
    assert Node.objects.get().state != NodeState.NOT_READY
    run_scheduler_cycle()
    assert Node.objects.get().state == NodeState.NOT_READY


def test_run_scheduler_does_the_housekeeping_once_a_second(monkeypatch):
    import threading

    from scheduler.cycle.loop import HOUSEKEEPING_SECONDS
    from scheduler.management.commands import run_scheduler

    clock = iter(i * 0.2 for i in range(1000))  # read twice a cycle: a cycle every 0.4 s
    monkeypatch.setattr(run_scheduler.time, "monotonic", lambda: next(clock))
    stop, flags = threading.Event(), []

    def cycle(interval: float, housekeeping: bool, skip_unchanged: bool = False) -> object:
        flags.append(housekeeping)
        if len(flags) == 12:
            stop.set()
        return run_scheduler.CycleReport()

    run_loop(monkeypatch, cycle, 0.2, stop)
    assert HOUSEKEEPING_SECONDS == 1.0
    assert flags == [True, False, False] * 4  # at 0, 1.2, 2.4 and 3.6 s
