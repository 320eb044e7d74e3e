"""Enqueue asks `job_valid` only of jobs outside open queues without a capability, where
every plugin implementing it says such jobs are valid (`Plugin.valid_in_open_queue`, as the
capability plugin does): a plugin that does not say so is asked of every job, and jobs of a
closed, capped or missing queue are still refused as before."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plugins import CapabilityPlugin
from scheduler.core.resources import Resources
from scheduler.core.session import Plugin, Session
from scheduler.core.status import Code, Status
from tests.core.builders import GI, job, node, snapshot

QUEUES = [
    QueueInfo("default"),
    QueueInfo("shut", open=False),
    QueueInfo("capped", capability=Resources(2000, 8 * GI, 0)),
]


def cluster() -> Any:
    jobs = [
        job(1),
        job(2, queue="shut"),
        job(3, queue="capped", cpu=4),  # more than the queue may ever hold
        job(4, queue="capped"),
        job(5, queue="nowhere"),
    ]
    return snapshot([node("n0", cpu=16)], jobs, QUEUES)


class Refuses(Plugin):
    """Refuses job 1, in an open queue without a capability (not `valid_in_open_queue`)."""

    name = "refuses"

    def job_valid(self, session: Session, job: JobInfo) -> Status | None:
        return Status(Code.NEVER_FITS, "refused") if job.id == 1 else None


def test_jobs_of_other_queues_are_still_refused() -> None:
    result = run_cycle(cluster(), SchedulingPolicy())
    assert {b.job_id for b in result.binds} == {1, 4}
    assert result.pending[2].code == Code.QUEUE_CLOSED
    assert result.pending[3].code == Code.NEVER_FITS
    assert result.pending[5].code == Code.QUEUE_MISSING


def test_a_plugin_that_does_not_say_so_is_asked_of_every_job() -> None:
    result = run_cycle(cluster(), SchedulingPolicy(extra_plugins=(Refuses(),)))
    assert result.pending[1].message == "refused"
    assert {b.job_id for b in result.binds} == {4}


def test_jobs_of_open_queues_without_a_capability_are_not_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    job_valid = CapabilityPlugin.job_valid

    def counting(self: CapabilityPlugin, session: Session, job: JobInfo) -> Status | None:
        asked.append(job.id)
        return job_valid(self, session, job)

    monkeypatch.setattr(CapabilityPlugin, "job_valid", counting)
    run_cycle(cluster(), SchedulingPolicy())
    assert sorted(asked) == [2, 3, 4, 5]
