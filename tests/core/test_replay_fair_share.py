"""Issue #21: per-user fair share in the replay (`scheduler.core.replay.FairShare`): usage of
the jobs finished so far, decayed and weighted as the product counts it, ordering the pending
jobs by the scheduler's own multifactor priority."""

from __future__ import annotations

import pytest

from scheduler.core.model import NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.priority import DAY, PriorityWeights
from scheduler.core.replay import FairShare, TraceJob, Usage, replay
from scheduler.core.resources import Resources
from tests.core.test_replay import generated_cluster, generated_trace, schedule

GI = 1 << 30
# The product's default weights (berth/settings.py BERTH_PRIORITY_WEIGHT_*).
PRODUCT = PriorityWeights(age=1000.0, fair_share=10000.0, priority=100.0)
EASY_FS = SchedulingPolicy(actions=SchedulingPolicy.easy().actions, priority_weights=PRODUCT)


def job(id: int, owner: str, submit: float, runtime: float, cpus: int = 1, gpus: int = 0,
        tasks: int = 1) -> TraceJob:  # fmt: skip
    return TraceJob(id, submit, tasks, Resources(cpus * 1000, GI, gpus), runtime, runtime * 2,
                    owner=owner)  # fmt: skip


@pytest.mark.parametrize(
    "ended, now, fair, expected",
    [
        # one job of 100 core-seconds, read when it ended, one and two half-lives later
        ([("a", 1, 0, 100.0, 0.0)], 100.0, FairShare(half_life=DAY), {"a": 100.0}),
        ([("a", 1, 0, 100.0, 0.0)], 100.0 + DAY, FairShare(half_life=DAY), {"a": 50.0}),
        ([("a", 1, 0, 100.0, 0.0)], 100.0 + 2 * DAY, FairShare(half_life=DAY), {"a": 25.0}),
        # no decay
        ([("a", 1, 0, 100.0, 0.0)], 100.0 + 9 * DAY, FairShare(half_life=0), {"a": 100.0}),
        # resource-weighted: 2 cores and 1 GPU for 10 s = 20 core-s + 10 x 10 GPU-s
        ([("a", 2, 1, 10.0, 0.0)], 10.0, FairShare(), {"a": 120.0}),
        ([("a", 2, 1, 10.0, 0.0)], 10.0, FairShare(cpu_weight=2, gpu_weight=0), {"a": 40.0}),
        # each job decays from its own end; owners apart
        (
            [("a", 1, 0, 100.0, 0.0), ("a", 1, 0, 100.0, DAY - 100.0), ("b", 4, 0, 10, DAY)],
            100.0 + DAY,
            FairShare(half_life=DAY),
            {"a": 50.0 + 100.0 * 2 ** (-100 / DAY), "b": 40.0 * 2 ** (-90 / DAY)},
        ),
        # an owner whose last job ended more than ten half-lives ago drops out
        (
            [("a", 1, 0, 100.0, 0.0), ("b", 1, 0, 100.0, 10 * DAY)],
            100.0 + 10.5 * DAY,
            FairShare(half_life=DAY),
            {"b": 100.0 * 2**-0.5},
        ),
        # 99 half-lives of jobs every 9 (the epoch moves up on the way): still exact
        (
            [("a", 1, 0, 100.0, 9 * k * DAY) for k in range(12)],
            100.0 + 99 * DAY,
            FairShare(half_life=DAY),
            {"a": sum(100.0 * 2.0 ** (-9 * (11 - k)) for k in range(12))},
        ),
    ],
)
def test_it_decays_and_weights_usage_as_the_product_does(ended, now, fair, expected):
    usage = Usage(fair)
    for i, (owner, cpus, gpus, runtime, start) in enumerate(ended):
        usage.finished(job(i, owner, start, runtime, cpus, gpus), start + runtime)
    got = usage.at(now)
    assert got.keys() == expected.keys()
    for owner, value in expected.items():
        assert got[owner] == pytest.approx(value, rel=1e-9)


def test_it_starts_the_light_users_job_before_the_heavy_users_older_ones():
    """The two-user case of the issue: a heavy user's long job ran; their next jobs wait
    behind a light user's later one with fair share on, ahead of it with it off."""
    nodes, queues = [NodeInfo("n0", Resources(1000, GI))], [QueueInfo("default")]
    jobs = [job(1, "heavy", 0, 10_000), job(2, "light", 0, 10)]
    jobs += [job(3 + i, "heavy", 100 + i, 100) for i in range(5)]
    jobs.append(job(9, "light", 200, 100))
    off = replay(jobs, nodes, queues, SchedulingPolicy.easy())
    on = replay(jobs, nodes, queues, EASY_FS, fair_share=FairShare(refresh=0))
    assert off.starts[9] > max(off.starts[3 + i] for i in range(5))
    # job 1 ends at 10,000 (job 2 at 10,010); from then on the light user goes first
    assert on.starts[9] == 10_010
    assert min(on.starts[3 + i] for i in range(5)) > on.starts[9]


def owned_trace() -> list[TraceJob]:
    jobs = generated_trace(3, 300)
    for i, j in enumerate(jobs):
        j.owner = f"u{(i * 7) % 5 if i % 3 else 0}"  # u0 submits most
    return jobs


def test_fair_share_decisions_are_deterministic_and_its_own():
    jobs = owned_trace()
    nodes, queues = generated_cluster()
    first = replay(jobs, nodes, queues, EASY_FS, fair_share=FairShare(half_life=3600))
    again = replay(jobs, nodes, queues, EASY_FS, fair_share=FairShare(half_life=3600))
    assert schedule(jobs, first) == schedule(jobs, again)
    assert first.first_reservation == again.first_reservation
    off = replay(jobs, nodes, queues, SchedulingPolicy.easy())
    assert schedule(jobs, first) != schedule(jobs, off)  # fair share does change decisions


@pytest.mark.parametrize("predictions", [False, True])
def test_full_cycles_and_the_standing_session_decide_the_same_with_fair_share(predictions):
    """The standing session told the usage decides as fresh snapshots carrying it do."""
    jobs = owned_trace()[:150]
    nodes, queues = generated_cluster()
    fair = FairShare(half_life=3600, refresh=0)
    full = replay(jobs, nodes, queues, EASY_FS, False, predictions, fair_share=fair)
    standing = replay(jobs, nodes, queues, EASY_FS, True, predictions, fair_share=fair)
    assert schedule(jobs, standing) == schedule(jobs, full)
    assert standing.first_reservation == full.first_reservation
