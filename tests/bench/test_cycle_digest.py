"""bench/cycle.py's decisions stay what they were (issue #21, "Fast"): the core's speed-ups
must leave the schedule of the benchmark's cluster exactly as it was. The digests were
taken with the core before them (f7263ca); a change that means to schedule differently
updates them and says why."""

from __future__ import annotations

import pytest

from bench.cycle import digest, measure, setup
from scheduler.core.cycle import run_cycle

DECIDED = {
    # (nodes, pending jobs, factors) -> digest of binds, evictions, statuses and factors
    (100, 1_000, True): "d940a8b85eca2ecb",
    (100, 1_000, False): "36c723cd84395932",
    (200, 3_000, True): "7aaccd63e3017164",
    (200, 3_000, False): "3526ce4acd601139",
}


@pytest.mark.parametrize(("nodes", "jobs", "factors"), sorted(DECIDED))
def test_the_benchmark_cluster_is_scheduled_as_before(nodes: int, jobs: int, factors: bool) -> None:
    snapshot, policy = setup(nodes, 8, jobs, seed=1, queues=4, factors=factors)
    assert digest(run_cycle(snapshot, policy)) == DECIDED[(nodes, jobs, factors)]


def test_the_digest_tells_schedules_apart() -> None:
    snapshot, policy = setup(100, 8, 1_000, seed=1, queues=4, factors=True)
    result = run_cycle(snapshot, policy)
    result.binds.reverse()  # the same binds in another order is another schedule
    assert digest(result) != DECIDED[(100, 1_000, True)]


def test_measure_prints_the_digest_when_asked() -> None:
    row = measure(100, 8, 1_000, seed=1, queues=4, repeat=2, factors=True, with_digest=True)
    assert row["digest"] == DECIDED[(100, 1_000, True)]
    assert "digest" not in measure(100, 8, 1_000, seed=1, queues=4, repeat=1)
