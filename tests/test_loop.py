"""The cycle report: where a cycle's time went, phase by phase, for the log and benchmarks."""

from __future__ import annotations

import re

import pytest

from scheduler.loop import PHASES, run_scheduler_cycle
from scheduler.models import Task
from scheduler.states import TaskState
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
