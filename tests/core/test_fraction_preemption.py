"""A whole-GPU job preempts lower-priority fractions within the preemption policy: it evicts
every fraction on one device (the device then comes back whole), none on a device that a
fraction it may not evict shares, and no more once its victims are being released."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, SchedulingPolicy
from scheduler.core.status import Code
from tests.core.builders import job, node, snapshot

TS = ("timeslice",)


def _jobs() -> list[JobInfo]:
    return [
        job(1, share=250, running_on=[("a", (0,))]),
        job(2, share=500, running_on=[("a", (0,))]),
        job(3, share=500, running_on=[("a", (1,))]),
        job(4, share=200, running_on=[("a", (1,))], priority=20),  # more than the preemptor
        job(5, gpu=1, priority=10),
    ]


def test_it_evicts_the_fractions_of_one_device_and_waits_for_it():
    result = run_cycle(snapshot([node("a", gpus=2, sharing=TS)], _jobs()), SchedulingPolicy())
    assert sorted(e.job_id for e in result.evictions) == [1, 2]
    assert all(e.preemptor_job_id == 5 for e in result.evictions)
    assert result.pending[5].code == Code.PREEMPTING and not result.binds


def test_it_evicts_no_more_while_its_victims_are_released():
    jobs = []
    for j in _jobs():
        if j.id in (1, 2):  # asked to stop last cycle: they hold their device until confirmed
            j = replace(
                j, state="Suspended", tasks=[replace(t, state="Releasing") for t in j.tasks]
            )
        jobs.append(j)
    result = run_cycle(snapshot([node("a", gpus=2, sharing=TS)], jobs), SchedulingPolicy())
    assert not result.evictions and not result.binds
    assert result.pending[5].code == Code.PREEMPTING


def test_fractions_of_the_same_or_higher_priority_or_not_preemptible_stay():
    jobs = [
        job(1, share=250, running_on=[("a", (0,))], priority=10),
        job(2, share=500, running_on=[("a", (1,))], preemptible=False),
        job(3, gpu=1, priority=10),
    ]
    result = run_cycle(snapshot([node("a", gpus=2, sharing=TS)], jobs), SchedulingPolicy())
    assert not result.evictions and result.pending[3].code != Code.PREEMPTING


def test_the_smaller_victim_goes_first_a_fraction_before_a_whole_gpu():
    jobs = [
        job(1, gpu=1, running_on=[("a", (0,))]),
        job(2, share=250, running_on=[("a", (1,))]),
        job(3, gpu=1, priority=10),
    ]
    result = run_cycle(snapshot([node("a", gpus=2, sharing=TS)], jobs), SchedulingPolicy())
    # The smaller victim first: the quarter GPU rather than the whole GPU.
    assert [e.job_id for e in result.evictions] == [2]
