"""bench/cycle_floor.py, the plain-Python floor of bench/cycle.py's cold cycle
(docs/benchmarks.md): every pending job either starts or waits, no device is given twice,
and it starts about as many jobs as the core does on the same cluster."""

from __future__ import annotations

from bench.cycle import setup
from bench.cycle_floor import run
from scheduler.core.cycle import run_cycle


def test_the_floor_starts_about_as_many_jobs_as_the_core() -> None:
    snapshot, policy = setup(100, 8, 1_000, seed=1, queues=4, factors=True)
    binds, statuses, _before = run(snapshot, 8)
    assert len(binds) + len(statuses) == 1_000
    given = [(node, d) for _job, node, devices in binds for d in devices]
    assert given and len(set(given)) == len(given)
    started = len({b.job_id for b in run_cycle(snapshot, policy).binds})
    assert abs(len(binds) - started) <= 0.05 * started
