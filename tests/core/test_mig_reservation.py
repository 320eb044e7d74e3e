"""The backfill reservation of a MIG job counts its instances (scheduler/core/backfill.py).

Its start is when enough instances of its profile are free (as the instances held are given
back: their occupants' walltimes end, Releasing occupants now), and backfill does not start
a job that would hold an instance the reservation needs past its start."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, NodeInfo, SchedulingPolicy
from scheduler.core.status import Code
from tests.core.builders import NOW, job, mig_uuid, node, snapshot

A, B = "1g.10gb", "2g.20gb"


def held(
    id: int, instance: str, ends_in: float | None, profile: str = A, **extra: object
) -> JobInfo:
    """A running job holding one instance on node "a" GPU 0, ending `ends_in` seconds from
    now (None: no walltime)."""
    return job(
        id,
        mig=profile,
        running_on=[("a", (0,))],
        instances=[instance],
        walltime=None if ends_in is None else ends_in + 100,  # (started 100 s ago)
        **extra,  # type: ignore[arg-type]
    )


def releasing(running: JobInfo) -> JobInfo:
    return replace(running, tasks=[replace(t, state="Releasing") for t in running.tasks])


def cpu_job_ending_in(id: int, seconds: float) -> JobInfo:
    """A running cpu-only job on node "a" that ends `seconds` from now."""
    return job(id, cpu=1, running_on=[("a", ())], walltime=seconds + 100)


@dataclass
class Case:
    name: str
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    reserved: int  # the job holding the reservation
    start: float | None  # its estimated start, seconds from now (None: unknown)
    backfilled: set[int] = field(default_factory=set)  # exactly the jobs started
    pending: dict[int, str] = field(default_factory=dict)  # job -> code


ONE = [node("a", gpus=1, mig={0: [A]})]
TWO = [node("a", gpus=1, mig={0: [A, A, B]})]

CASES = [
    Case(
        "its start is when the instance held is given back, not when cpu is",
        ONE,
        [held(1, mig_uuid("a", 0, 0), 1000), cpu_job_ending_in(2, 200), job(3, mig=A, priority=5)],
        reserved=3,
        start=1000,
    ),
    Case(
        "an instance held by a job without walltime: the start is unknown",
        ONE,
        [held(1, mig_uuid("a", 0, 0), None), cpu_job_ending_in(2, 200), job(3, mig=A, priority=5)],
        reserved=3,
        start=None,
    ),
    Case(
        "an instance whose occupant is being released is free now",
        ONE,
        [
            releasing(held(1, mig_uuid("a", 0, 0), None)),
            job(2, cpu=7, running_on=[("a", ())], walltime=300),  # 7 of 8 cpus until +200
            job(3, mig=A, cpu=2, priority=5),
        ],
        reserved=3,
        start=200,
    ),
    Case(
        "a gang of two instances waits for the second one to be given back",
        TWO,
        [
            held(1, mig_uuid("a", 0, 0), 1000),
            cpu_job_ending_in(2, 200),
            job(3, mig=A, replicas=2, priority=5),
        ],  # fmt: skip
        reserved=3,
        start=1000,
    ),
    Case(
        "a later instance job that would run past the start may not take the free instance",
        TWO,
        [
            held(1, mig_uuid("a", 0, 0), 1000),
            job(3, mig=A, replicas=2, priority=5),
            job(4, mig=A, walltime=2000),
        ],  # fmt: skip
        reserved=3,
        start=1000,
        pending={4: Code.RESERVED_FOR_OTHER},
    ),
    Case(
        "a later instance job that ends before the start backfills onto the free instance",
        TWO,
        [
            held(1, mig_uuid("a", 0, 0), 1000),
            job(3, mig=A, replicas=2, priority=5),
            job(4, mig=A, walltime=500),
        ],  # fmt: skip
        reserved=3,
        start=1000,
        backfilled={4},
    ),
    Case(
        "an instance of another profile backfills past the start: the reservation needs none",
        TWO,
        [
            held(1, mig_uuid("a", 0, 0), 1000),
            job(3, mig=A, replicas=2, priority=5),
            job(4, mig=B, walltime=5000),
        ],  # fmt: skip
        reserved=3,
        start=1000,
        backfilled={4},
    ),
    Case(
        "instances on another node are the reservation's if they are free first",
        [node("a", gpus=1, mig={0: [A]}), node("b", gpus=1, mig={0: [A, A]})],
        [
            held(1, mig_uuid("a", 0, 0), 500),
            job(
                2, mig=A, running_on=[("b", (0,))], instances=[mig_uuid("b", 0, 0)], walltime=1100
            ),  # (on b until +1000)
            job(3, mig=A, replicas=3, priority=5),
            job(4, mig=A, walltime=2000),  # would take b's free one past +1000
        ],  # fmt: skip
        reserved=3,
        start=1000,
        pending={4: Code.RESERVED_FOR_OTHER},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_reservation_of_a_mig_job_counts_its_instances(case: Case) -> None:
    result = run_cycle(snapshot(case.nodes, case.jobs), SchedulingPolicy())
    status = result.pending[case.reserved]
    assert status.code == Code.RESERVED, status
    want = None if case.start is None else NOW + case.start
    assert status.estimated_start == want, status
    assert {b.job_id for b in result.binds} == case.backfilled
    for job_id, code in case.pending.items():
        assert result.pending[job_id].code == code, result.pending[job_id]
