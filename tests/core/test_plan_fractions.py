"""Start estimates count a fraction of a GPU as the fraction (scheduler/core/plan.py): waiting
fractions that fit one device together are planned to start together once it is free, a
fraction may join a device already shared, and each job then binds at its estimate."""

from __future__ import annotations

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, NodeInfo
from scheduler.core.plan import plan_starts
from tests.core.builders import NOW, job, node, snapshot
from tests.core.simulation import simulate

TS = ("timeslice",)


def _cluster() -> list[JobInfo]:
    """One GPU held whole until NOW+900; four quarters and a whole GPU wait."""
    return [
        job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
        *(job(i, share=250, walltime=500) for i in range(2, 6)),
        job(9, gpu=1, walltime=100),
    ]


def _estimates(nodes: list[NodeInfo], jobs: list[JobInfo]) -> dict[int, float]:
    snap = snapshot(nodes, jobs)
    plan = plan_starts(snap, run_cycle(snap))
    return {j: t - NOW for j, t in plan.starts.items() if t is not None}


def test_quarters_that_share_one_device_are_planned_to_start_together():
    nodes = [node("a", gpus=1, sharing=TS)]
    # (counted as a whole device each, they would start at 900, 1400, 1900 and 2400)
    assert _estimates(nodes, _cluster()) == {2: 900, 3: 900, 4: 900, 5: 900, 9: 1400}


def _shared() -> list[JobInfo]:
    return [
        job(1, share=500, walltime=2000, running_on=[("a", (0,))]),  # shared until 1900
        job(2, cpu=1, walltime=600, running_on=[("a", ())]),  # the other core until 500
        job(5, gpu=1, cpu=0, walltime=1100, running_on=[("a", (1,))]),  # device 1 until 1000
        job(6, gpu=1, cpu=0, walltime=100, created_at=0.5),  # reserved: device 1 at 1000
        job(3, share=250, cpu=1, walltime=300),  # joins device 0 once a core is free
        job(4, share=500, cpu=1, walltime=5000),  # runs past 1900: a device of its own
    ]


def test_a_fraction_joins_a_device_already_shared_while_it_stays_shared():
    nodes = [node("a", gpus=2, sharing=TS, cpu=2)]
    # (counted as a whole device, job 3 would wait for device 1 after job 6, at 1100)
    assert _estimates(nodes, _shared()) == {6: 1000, 3: 500, 4: 1100}


def test_each_fraction_binds_at_its_estimate():
    nodes = [node("a", gpus=1, sharing=TS)]
    assert simulate(nodes, _cluster()) == {
        j: NOW + t for j, t in _estimates(nodes, _cluster()).items()
    }


def _gangs() -> list[JobInfo]:
    """Two GPUs held whole until 900 and 1400; gangs of fractions and a whole GPU wait."""
    return [
        job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
        job(2, gpu=1, walltime=1500, running_on=[("a", (1,))]),
        job(3, share=250, replicas=4, walltime=500),
        job(4, share=500, replicas=3, walltime=300),
        job(5, gpu=1, walltime=100),
    ]


def test_gangs_of_fractions_bind_at_their_estimates():
    nodes = [node("a", gpus=2, sharing=TS, cpu=16)]
    estimates = _estimates(nodes, _gangs())
    # (each gang packed: four quarters on one device, three halves on two)
    assert estimates == {3: 900, 4: 1400, 5: 1700}
    assert simulate(nodes, _gangs()) == {j: NOW + t for j, t in estimates.items()}
