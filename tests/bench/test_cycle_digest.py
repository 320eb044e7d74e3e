"""bench/cycle.py's decisions stay what they were (issue #21, "Fast"): the core's speed-ups
must leave the schedule of the benchmark's cluster exactly as it was. The digests were
taken with the core before them (f7263ca); a change that means to schedule differently
updates them and says why."""

from __future__ import annotations

import pytest

from bench.cycle import digest, measure, settle, setup
from scheduler.core.cycle import run_cycle

DECIDED = {
    # (nodes, pending jobs, factors) -> digest of binds, evictions, statuses and factors
    (100, 1_000, True): "d940a8b85eca2ecb",
    (100, 1_000, False): "36c723cd84395932",
    (200, 3_000, True): "7aaccd63e3017164",
    (200, 3_000, False): "3526ce4acd601139",
}

# `--steady`: the cycle after the first, its binds applied (`settle`; taken with the core of
# 8e12f95, before the steady cycle's speed-ups).
STEADY = {
    (100, 1_000, True): "7c57433bc027ff07",
    (100, 1_000, False): "0fd68d0ad5de884f",
    (100, 3_000, True): "9db71f5692c7e94a",
    (100, 3_000, False): "35c545e7f3495573",
    (200, 3_000, True): "ae1046b005479bfe",
    (200, 3_000, False): "79613630469c9e03",
}


@pytest.mark.parametrize(("nodes", "jobs", "factors"), sorted(DECIDED))
def test_the_benchmark_cluster_is_scheduled_as_before(nodes: int, jobs: int, factors: bool) -> None:
    snapshot, policy = setup(nodes, 8, jobs, seed=1, queues=4, factors=factors)
    assert digest(run_cycle(snapshot, policy)) == DECIDED[(nodes, jobs, factors)]


@pytest.mark.parametrize(("nodes", "jobs", "factors"), sorted(STEADY))
def test_the_steady_cycle_is_scheduled_as_before(nodes: int, jobs: int, factors: bool) -> None:
    snapshot, policy = setup(nodes, 8, jobs, seed=1, queues=4, factors=factors)
    settle(snapshot, run_cycle(snapshot, policy))
    assert digest(run_cycle(snapshot, policy)) == STEADY[(nodes, jobs, factors)]


def test_settle_starts_what_the_cycle_bound_and_nothing_else() -> None:
    snapshot, policy = setup(100, 8, 3_000, seed=1, queues=4, factors=True)  # (it evicts)
    pending = {j.id for j in snapshot.jobs if j.state == "Pending"}
    result = run_cycle(snapshot, policy)
    settle(snapshot, result)
    bound = {b.task_id: b for b in result.binds}
    assert bound and result.evictions
    for job in snapshot.jobs:
        started = [t for t in job.tasks if t.id in bound]
        assert (job.state == "Running") == (bool(started) or job.id not in pending)
        for task in started:
            b = bound[task.id]
            assert (task.state, task.node, task.devices) == ("Running", b.node, b.devices)
            assert task.started_at == snapshot.now
    evicted = {e.job_id for e in result.evictions}
    assert all(t.state == "Running" for j in snapshot.jobs if j.id in evicted for t in j.tasks)


def test_the_digest_tells_schedules_apart() -> None:
    snapshot, policy = setup(100, 8, 1_000, seed=1, queues=4, factors=True)
    result = run_cycle(snapshot, policy)
    result.binds.reverse()  # the same binds in another order is another schedule
    assert digest(result) != DECIDED[(100, 1_000, True)]


def test_measure_prints_the_digest_when_asked() -> None:
    row = measure(100, 8, 1_000, seed=1, queues=4, repeat=2, factors=True, with_digest=True)
    assert row["digest"] == DECIDED[(100, 1_000, True)]
    assert "digest" not in measure(100, 8, 1_000, seed=1, queues=4, repeat=1)
    row = measure(100, 8, 1_000, 1, 4, repeat=2, factors=True, with_digest=True, steady=True)
    assert row["digest"] == STEADY[(100, 1_000, True)] and row["steady"]
    assert row["pending_jobs"] < 1_000
