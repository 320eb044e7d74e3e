"""A cycle runs with Python's cyclic garbage collector paused (issue #21, "Fast"): its full
collections walked every object of a 100k-job snapshot several times per cycle. The
collector is back as it was after the cycle, however the cycle ends."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, SchedulingPolicy
from scheduler.core.plugins import Plugin
from scheduler.core.session import Session
from tests.core.builders import job, node, placed_jobs, snapshot


class _Watch(Plugin):
    """Notes whether the collector is on each time the cycle orders a job."""

    name = "watch"

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def job_key(self, session: Session, job: JobInfo) -> tuple[int, ...]:
        self.seen.append(gc.isenabled())
        return ()


class _Broken(Plugin):
    name = "broken"

    def open(self, session: Session) -> None:
        raise RuntimeError("plugin failed to open")


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_cycle_runs_with_the_collector_paused_and_turns_it_back_on(collector_on):
    watch = _Watch()
    cluster = snapshot([node("n1", cpu=4)], [job(1), job(2)])
    result = run_cycle(cluster, SchedulingPolicy(extra_plugins=(watch,)))
    assert placed_jobs(result) == {1, 2}
    assert watch.seen and not any(watch.seen)
    assert gc.isenabled()


def test_a_cycle_that_raises_turns_the_collector_back_on(collector_on):
    cluster = snapshot([node("n1")], [job(1)])
    with pytest.raises(RuntimeError, match="plugin failed to open"):
        run_cycle(cluster, SchedulingPolicy(extra_plugins=(_Broken(),)))
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_stays_off(collector_on):
    gc.disable()
    result = run_cycle(snapshot([node("n1")], [job(1)]))
    assert placed_jobs(result) == {1}
    assert not gc.isenabled()
