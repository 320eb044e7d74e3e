"""Fractions where the core sums GPUs (issue #23's open gaps): gangs of fractions in start
estimates and in EASY's reservation, and the device a shared GPU's occupants give back only
when they have all really left."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, NodeInfo, SchedulingPolicy
from scheduler.core.plan import plan_starts
from scheduler.core.status import Code
from tests.core.builders import NOW, job, node, snapshot

TS = ("timeslice",)
ALLOCATE = SchedulingPolicy(actions=("enqueue", "allocate"))
EASY = SchedulingPolicy.easy()


def _releasing(j: JobInfo) -> JobInfo:
    return replace(j, tasks=[replace(t, state="Releasing") for t in j.tasks])


# --- start estimates (scheduler/core/plan.py) ------------------------------------------------


@dataclass
class PlanCase:
    name: str
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    starts: dict[int, float | None]  # job -> estimate, seconds from now (None: unknown)
    config: SchedulingPolicy = ALLOCATE


PLAN_CASES = [
    PlanCase(
        "a gang of four quarters shares one device once it is free",
        [node("a", gpus=1, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, share=250, replicas=4, walltime=500)],
        {2: 900},
    ),
    PlanCase(
        "a gang of two halves needs one device, three halves two",
        [node("a", gpus=2, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=2000, running_on=[("a", (1,))]),
         job(4, share=500, replicas=3, walltime=100, created_at=0.5),
         job(2, share=500, replicas=2, walltime=100, created_at=0.6)],
        {4: 1900, 2: 900},
        SchedulingPolicy(actions=("enqueue", "allocate"), strict_order=False),
    ),
    PlanCase(
        "a gang of fractions with the reservation starts when the core says",
        [node("a", gpus=1, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, share=250, replicas=4, walltime=500)],
        {2: 900},
        EASY,
    ),
    PlanCase(
        "a shared device whose other occupant is releasing comes back when the last one ends",
        [node("a", gpus=1, sharing=TS)],
        [_releasing(job(1, share=500, walltime=5000, running_on=[("a", (0,))])),
         job(2, share=500, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: 900},
    ),
    PlanCase(
        "a shared device whose other occupant is being suspended comes back at the last end",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=500, walltime=5000, running_on=[("a", (0,))], suspend_requested=True),
         job(2, share=500, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: 900},
    ),
    PlanCase(
        "a device shared with an occupant without walltime never comes back",
        [node("a", gpus=1, sharing=TS)],
        [_releasing(job(1, share=500, walltime=5000, running_on=[("a", (0,))])),
         job(2, share=500, walltime=None, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: None},
    ),
    PlanCase(
        "whole GPUs are planned as before",
        [node("a", gpus=2)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, gpu=1, replicas=2, walltime=500)],
        {2: 900},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.name)
def test_start_estimates(case: PlanCase) -> None:
    snap = snapshot(case.nodes, case.jobs)
    plan = plan_starts(snap, run_cycle(snap, case.config), case.config)
    starts = {j: None if t is None else t - NOW for j, t in plan.starts.items()}
    assert {j: starts.get(j) for j in case.starts} == case.starts


# --- EASY's reservation (scheduler/core/backfill.py) -----------------------------------------


def test_a_gang_of_fractions_holds_a_reservation_that_backfill_does_not_delay() -> None:
    """Eight quarters need two devices: one is free now, the other at 900. A whole-GPU job
    running past 900 would take the free one and delay the gang; one ending before may run."""
    nodes = [node("a", gpus=2, sharing=TS)]
    jobs = [
        job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
        job(2, share=250, replicas=8, walltime=500),
        job(3, gpu=1, walltime=5000),
        job(4, gpu=1, walltime=500),
    ]
    result = run_cycle(snapshot(nodes, jobs), EASY)
    assert result.pending[2].code == Code.RESERVED
    assert result.pending[2].estimated_start == NOW + 900
    assert {b.job_id for b in result.binds} == {4}
    assert result.pending[3].code == Code.RESERVED_FOR_OTHER
