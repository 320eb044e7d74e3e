"""Queue positions and start estimates (scheduler/core/plan.py) agree with what the scheduler
then does: advancing time to each estimate and running the cycle binds that job then."""

from __future__ import annotations

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plan import plan_starts
from scheduler.core.status import Code
from tests.core.builders import NOW, job, node, snapshot
from tests.core.simulation import simulate

NODES = [node("n1", gpus=4), node("n2", gpus=4)]


def busy_cluster() -> list[JobInfo]:
    """n1 frees at NOW+900, n2 at NOW+1900; four jobs wait, oldest first."""
    return [
        job(1, gpu=4, walltime=1000, running_on=[("n1", (0, 1, 2, 3))]),
        job(2, gpu=4, walltime=2000, running_on=[("n2", (0, 1, 2, 3))]),
        job(10, gpu=4, walltime=500),  # n1 at 900
        job(11, gpu=4, replicas=2, walltime=1000),  # both nodes: n2 at 1900
        job(12, gpu=2, walltime=300),  # fits n1 between the two: 1400
        job(13, gpu=1, walltime=None),  # for ever: once the gang ends, 2900
    ]


def test_every_waiting_job_gets_its_position_and_estimate():
    snap = snapshot(NODES, busy_cluster())
    result = run_cycle(snap)
    plan = plan_starts(snap, result)
    assert plan.positions == {10: 1, 11: 2, 12: 3, 13: 4}
    assert {j: t - NOW for j, t in plan.starts.items() if t is not None} == {
        10: 900, 11: 1900, 12: 1400, 13: 2900,
    }  # fmt: skip


def test_the_reserved_job_starts_when_the_core_reserved_it():
    snap = snapshot(NODES, busy_cluster())
    result = run_cycle(snap)
    status = result.pending[10]
    assert status.code == Code.RESERVED
    assert plan_starts(snap, result).starts[10] == status.estimated_start


def test_each_job_binds_at_its_estimate():
    snap = snapshot(NODES, busy_cluster())
    estimates = plan_starts(snap, run_cycle(snap)).starts
    assert simulate(NODES, busy_cluster()) == estimates


def test_each_job_binds_at_its_estimate_first_come_first_served():
    config = SchedulingPolicy.fcfs()
    snap = snapshot(NODES, busy_cluster())
    estimates = plan_starts(snap, run_cycle(snap, config), config).starts
    # In strict order job 12 may not pass the gang, which holds both nodes until 2900.
    assert estimates[12] == NOW + 2900
    assert simulate(NODES, busy_cluster(), config) == estimates


def test_a_job_that_fits_now_but_is_not_placed_would_start_now():
    jobs = [job(1, gpu=4, walltime=100, running_on=[("n1", (0, 1, 2, 3))]), job(5, gpu=2)]
    snap = snapshot(NODES, jobs)
    result = run_cycle(snap)
    assert result.binds  # job 5 binds now: it is no longer waiting
    plan = plan_starts(snap, result)
    assert plan.positions == {} and plan.starts == {}


def test_the_estimate_is_unknown_behind_a_job_without_walltime():
    jobs = [
        job(1, gpu=4, walltime=None, running_on=[("n1", (0, 1, 2, 3))]),
        job(2, gpu=4, walltime=600, running_on=[("n2", (0, 1, 2, 3))]),
        job(10, gpu=4, replicas=2),  # needs n1 too: held for ever
        job(11, gpu=2, walltime=300),  # n2 is kept for the reserved gang: unknown too
    ]
    snap = snapshot(NODES, jobs)
    result = run_cycle(snap)
    assert result.pending[10].code == Code.RESERVED
    assert result.pending[10].estimated_start is None
    plan = plan_starts(snap, result)
    assert plan.starts == {10: None, 11: None}
    assert plan.positions == {10: 1, 11: 2}


def test_a_job_that_never_fits_has_no_estimate_but_keeps_its_place():
    jobs = busy_cluster() + [job(9, gpu=8)]  # 8 GPUs on one node: never
    snap = snapshot(NODES, jobs)
    result = run_cycle(snap)
    assert result.pending[9].code == Code.NEVER_FITS
    plan = plan_starts(snap, result)
    assert plan.positions[9] == 1 and plan.starts[9] is None
    assert plan.starts[10] == NOW + 900


def test_positions_are_per_queue_in_priority_then_age_order():
    queues = [QueueInfo("default"), QueueInfo("other")]
    jobs = busy_cluster() + [
        job(20, gpu=4, queue="other"),
        job(21, gpu=4, queue="other", priority=5),
        job(22, gpu=4, priority=3),
    ]
    snap = snapshot(NODES, jobs, queues=queues)
    plan = plan_starts(snap, run_cycle(snap))
    assert plan.positions == {22: 1, 10: 2, 11: 3, 12: 4, 13: 5, 21: 1, 20: 2}


def test_only_the_first_depth_jobs_are_planned():
    snap = snapshot(NODES, busy_cluster())
    plan = plan_starts(snap, run_cycle(snap), depth=2)
    assert plan.planned == 2
    assert plan.starts[10] == NOW + 900 and plan.starts[11] == NOW + 1900
    assert plan.starts[12] is None and plan.starts[13] is None
    assert len(plan.positions) == 4
