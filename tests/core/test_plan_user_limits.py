"""Issue #21: start estimates respect per-user running limits. A job held by `UserLimit`
cannot start before enough of its owner's running (and earlier planned) jobs end to fit under
the limit, however free the nodes are; its estimate says so, and the scheduler then binds it
at that estimate."""

from __future__ import annotations

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plan import fingerprint, plan_starts
from scheduler.core.status import Code
from tests.core.builders import NOW, job, node, snapshot
from tests.core.simulation import simulate

NODES = [node("n1", gpus=4), node("n2", gpus=4)]


def jobs_limit() -> QueueInfo:
    return QueueInfo("default", max_user_jobs=1)


# Running jobs start at NOW - 100: one of walltime 1000 ends at NOW + 900.
CASES: dict[str, tuple[QueueInfo, list[JobInfo], dict[int, float | None]]] = {
    "one job at a time: after the owner's running job": (
        jobs_limit(),
        [job(1, gpu=1, walltime=1000, owner="a", running_on=[("n1", (0,))]),
         job(10, gpu=1, walltime=500, owner="a")],
        {10: 900},
    ),
    "one job at a time: the owner's next waits for the one planned before it": (
        jobs_limit(),
        [job(1, gpu=1, walltime=1000, owner="a", running_on=[("n1", (0,))]),
         job(10, gpu=1, walltime=500, owner="a"),
         job(11, gpu=1, walltime=300, owner="a")],
        {10: 900, 11: 1400},
    ),
    "GPUs: two of four free once the first job ends": (
        QueueInfo("default", max_user_gpus=4),
        [job(1, gpu=2, walltime=1000, owner="a", running_on=[("n1", (0, 1))]),
         job(2, gpu=2, walltime=2000, owner="a", running_on=[("n2", (0, 1))]),
         job(10, gpu=2, walltime=500, owner="a")],
        {10: 900},
    ),
    "GPUs: three need both running jobs ended": (
        QueueInfo("default", max_user_gpus=4),
        [job(1, gpu=2, walltime=1000, owner="a", running_on=[("n1", (0, 1))]),
         job(2, gpu=2, walltime=2000, owner="a", running_on=[("n2", (0, 1))]),
         job(10, gpu=3, walltime=500, owner="a")],
        {10: 1900},
    ),
    "CPUs": (
        QueueInfo("default", max_user_cpus=2000),
        [job(1, cpu=2, walltime=1000, owner="a", running_on=[("n1", ())]),
         job(10, cpu=1, walltime=500, owner="a")],
        {10: 900},
    ),
    "another owner's running job does not count": (
        jobs_limit(),
        [job(1, gpu=1, walltime=1000, owner="b", running_on=[("n1", (0,))]),
         job(2, gpu=1, walltime=2000, owner="a", running_on=[("n2", (0,))]),
         job(10, gpu=1, walltime=500, owner="a")],
        {10: 1900},
    ),
    "the owner's running job has no walltime: unknown": (
        jobs_limit(),
        [job(1, gpu=1, walltime=None, owner="a", running_on=[("n1", (0,))]),
         job(10, gpu=1, walltime=500, owner="a")],
        {10: None},
    ),
    "more than the limit itself: unknown": (
        QueueInfo("default", max_user_gpus=2),
        [job(1, gpu=1, walltime=1000, owner="a", running_on=[("n1", (0,))]),
         job(10, gpu=4, walltime=500, owner="a")],
        {10: None},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_estimate_waits_for_the_owners_running_jobs(case):
    queue, jobs, expected = CASES[case]
    snap = snapshot(NODES, jobs, [queue])
    result = run_cycle(snap)
    assert {j: result.pending[j].code for j in expected} == dict.fromkeys(expected, Code.USER_LIMIT)
    starts = plan_starts(snap, result).starts
    got = {j: None if (at := starts[j]) is None else at - NOW for j in expected}
    assert got == expected


def test_an_exempt_owner_is_planned_on_the_nodes_alone():
    queue = QueueInfo("default", max_user_jobs=1, limits_exempt=frozenset({"a"}))
    jobs = [
        job(1, gpu=4, walltime=1000, owner="a", running_on=[("n1", (0, 1, 2, 3))]),
        job(2, gpu=4, walltime=2000, owner="b", running_on=[("n2", (0, 1, 2, 3))]),
        job(10, gpu=4, walltime=500, owner="a"),
    ]
    snap = snapshot(NODES, jobs, [queue])
    assert plan_starts(snap, run_cycle(snap)).starts[10] == NOW + 900


def test_a_changed_limit_makes_the_plan_again():
    """The loop reuses a plan while its fingerprint stands (scheduler/cycle/planning.py)."""
    jobs = CASES["CPUs"][1]
    plans = set()
    exempt = frozenset({"a"})
    queues = [jobs_limit(), QueueInfo("default", max_user_jobs=2)]
    queues.append(QueueInfo("default", max_user_jobs=2, limits_exempt=exempt))
    for queue in queues:
        snap = snapshot(NODES, jobs, [queue])
        plans.add(fingerprint(snap, run_cycle(snap), None))
    assert len(plans) == 3


@pytest.mark.parametrize("config", [None, SchedulingPolicy.fcfs()])
def test_each_limited_job_binds_at_its_estimate(config):
    """Advance time to every end and estimate: the core binds each job at its estimate, and
    in strict order a job held by its owner's limit holds up no other owner's job."""
    jobs = [
        job(1, gpu=1, walltime=1000, owner="a", running_on=[("n1", (0,))]),
        job(10, gpu=1, walltime=500, owner="a"),
        job(11, gpu=1, walltime=300, owner="a"),
        job(12, gpu=4, walltime=1000, owner="b", running_on=[("n2", (0, 1, 2, 3))]),
        job(13, gpu=4, walltime=200, owner="b"),  # n2 at 900, not after a's at 1400
        job(14, gpu=1, walltime=100, owner="c"),
    ]
    snap = snapshot(NODES, jobs, [jobs_limit()])
    estimates = plan_starts(snap, run_cycle(snap, config), config).starts
    assert estimates == {10: NOW + 900, 11: NOW + 1400, 13: NOW + 900}
    assert simulate(NODES, jobs, config, [jobs_limit()]) == {14: NOW, **estimates}
