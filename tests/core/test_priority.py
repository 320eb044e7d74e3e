"""Table-driven tests of the multifactor priority (age, fair share on decayed usage, size,
queue, the job's own priority) and of per-user running limits, in the pure core."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy
from scheduler.core.priority import (
    DAY,
    PriorityWeights,
    age_factor,
    combine,
    decayed,
    fair_share_factor,
    fair_share_factors,
)
from scheduler.core.replay import replay
from tests.core.builders import NOW, job, node, placed_jobs, snapshot
from tests.core.test_replay import (
    FIXTURES,
    generated_cluster,
    generated_trace,
    kth_cluster,
    kth_trace,
    schedule,
)

FAIR = PriorityWeights(fair_share=10_000, age=1_000)


def owned(j: JobInfo, owner: str) -> JobInfo:
    return dataclasses.replace(j, owner=owner)


@pytest.mark.parametrize(
    ("usage", "elapsed", "half_life", "expected"),
    [
        (100.0, 0.0, 7 * DAY, 100.0),
        (100.0, 7 * DAY, 7 * DAY, 50.0),
        (100.0, 14 * DAY, 7 * DAY, 25.0),
        (100.0, 3.5 * DAY, 7 * DAY, 100 / 2**0.5),
        (100.0, 30 * DAY, 0.0, 100.0),  # half-life 0: no decay
        (0.0, DAY, DAY, 0.0),
    ],
)
def test_it_decays_usage_with_the_half_life(usage, elapsed, half_life, expected):
    assert decayed(usage, elapsed, half_life) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("usage", "total_usage", "share", "total_shares", "expected"),
    [
        (0.0, 0.0, 1.0, 2.0, 1.0),  # nobody used anything
        (0.0, 100.0, 1.0, 2.0, 1.0),  # this user used nothing
        (50.0, 100.0, 1.0, 2.0, 0.5),  # used exactly the share
        (100.0, 100.0, 1.0, 2.0, 0.25),  # used twice the share
        (100.0, 100.0, 1.0, 1.0, 0.5),  # the only user, all of it
        (25.0, 100.0, 3.0, 4.0, 2 ** (-1 / 3)),  # a bigger share forgives more usage
        (10.0, 100.0, 0.0, 4.0, 0.0),  # no share: the lowest factor
    ],
)
def test_it_computes_slurms_classic_fair_share_factor(
    usage, total_usage, share, total_shares, expected
):
    assert fair_share_factor(usage, total_usage, share, total_shares) == pytest.approx(expected)


def test_it_gives_users_without_a_share_row_the_default_share():
    factors = fair_share_factors({"heavy": 300.0, "light": 100.0}, {"vip": 2.0}, {"new"})
    # shares: heavy 1, light 1, new 1, vip 2 (of 5); usage: heavy 3/4, light 1/4
    assert factors["new"] == factors["vip"] == 1.0
    assert factors["heavy"] == pytest.approx(2 ** (-0.75 / 0.2))
    assert factors["light"] == pytest.approx(2 ** (-0.25 / 0.2))


@pytest.mark.parametrize(
    ("weights", "factors", "expected"),
    [
        (PriorityWeights(), (0.5, 0.5, 0.5, 0.5, 10), 0.0),
        (PriorityWeights(age=1000), (0.25, 0.9, 0.5, 0.5, 10), 250.0),
        (PriorityWeights(fair_share=10_000), (0.25, 0.5, 0.5, 0.5, 10), 5000.0),
        (PriorityWeights(job_size=100), (0.0, 0.0, 0.25, 0.0, 0), 25.0),
        (PriorityWeights(job_size=100, favor_small=True), (0.0, 0.0, 0.25, 0.0, 0), 75.0),
        (PriorityWeights(queue=10), (0.0, 0.0, 0.0, 0.5, 0), 5.0),
        (PriorityWeights(priority=100), (0.0, 0.0, 0.0, 0.0, 3), 300.0),
        (PriorityWeights(age=1, fair_share=2, job_size=3, queue=4, priority=5),
         (1.0, 1.0, 1.0, 1.0, 1), 15.0),
    ],
)  # fmt: skip
def test_it_sums_the_weighted_factors(weights, factors, expected):
    age, fair, size, queue, own = factors
    assert combine(weights, age, fair, size, queue, own).priority == pytest.approx(expected)


@pytest.mark.parametrize(
    ("waited", "max_age", "expected"),
    [(0.0, 100.0, 0.0), (50.0, 100.0, 0.5), (500.0, 100.0, 1.0), (-5.0, 100.0, 0.0)],
)
def test_it_caps_the_age_factor_at_max_age(waited, max_age, expected):
    assert age_factor(waited, max_age) == expected


def test_it_refuses_a_negative_weight():
    with pytest.raises(ValueError, match="fair_share"):
        PriorityWeights(fair_share=-1)


def test_factors_off_orders_by_own_priority_then_age_as_before():
    jobs = [job(1, gpu=1, priority=0), job(2, gpu=1, priority=5), job(3, gpu=1, priority=0)]
    snap = snapshot([node("n", gpus=1)], [owned(jobs[0], "heavy"), jobs[1], jobs[2]])
    snap.usage = {"heavy": 1e9}
    result = run_cycle(snap, SchedulingPolicy.easy())
    assert placed_jobs(result) == {2}
    assert result.factors == {}


def test_the_light_user_starts_on_the_first_free_gpu_ahead_of_2000_pending_jobs():
    """One user's 2,000 pending jobs, submitted first; the other user's job, submitted
    last, takes the first GPU that frees up."""
    heavy = [owned(job(i, gpu=1, created_at=NOW - 3000 + i), "heavy") for i in range(1, 2001)]
    light = owned(job(5000, gpu=1, created_at=NOW - 1), "light")
    running = owned(job(9000, gpu=1, running_on=[("n", (0,))], created_at=0.0), "heavy")
    snap = snapshot([node("n", gpus=1)], [running, *heavy, light])
    snap.usage = {"heavy": 3600.0 * 8}
    config = dataclasses.replace(SchedulingPolicy.easy(), priority_weights=FAIR)
    assert placed_jobs(run_cycle(snap, config)) == set()  # the only GPU is busy
    freed = dataclasses.replace(snap, jobs=[*heavy, light])
    result = run_cycle(freed, config)
    assert placed_jobs(result) == {5000}
    assert result.factors[5000].fair_share == 1.0
    assert result.factors[1].fair_share < 0.5
    # With the factors off it is first come, first served, as before.
    assert placed_jobs(run_cycle(freed, SchedulingPolicy.easy())) == {1}


def test_the_light_user_goes_first_even_with_no_history_when_usage_is_decayed_away():
    """Yesterday's heavy user and today's light one: usage as given (the adapter decays
    it); more usage, lower factor, later start."""
    a = owned(job(1, gpu=1), "yesterday")
    b = owned(job(2, gpu=1), "today")
    snap = snapshot([node("n", gpus=1)], [a, b])
    config = dataclasses.replace(SchedulingPolicy.easy(), priority_weights=FAIR)
    snap.usage = {"yesterday": decayed(1000.0, 1 * DAY, 7 * DAY), "today": 10.0}
    assert placed_jobs(run_cycle(snap, config)) == {2}
    snap.usage = {"yesterday": decayed(1000.0, 70 * DAY, 7 * DAY), "today": 10.0}
    assert placed_jobs(run_cycle(snap, config)) == {1}


def test_a_bigger_share_forgives_more_usage():
    a, b = owned(job(1, gpu=1), "a"), owned(job(2, gpu=1), "b")
    snap = snapshot([node("n", gpus=1)], [a, b])
    snap.usage = {"a": 300.0, "b": 100.0}
    config = dataclasses.replace(SchedulingPolicy(), priority_weights=FAIR)
    assert placed_jobs(run_cycle(snap, config)) == {2}
    snap.shares = {"a": 5.0}
    assert placed_jobs(run_cycle(snap, config)) == {1}


def test_the_job_size_factor_favours_large_or_small_jobs():
    small, big = job(1, gpu=1), job(2, gpu=4)
    snap = snapshot([node("n", gpus=4)], [small, big])
    large_first = dataclasses.replace(
        SchedulingPolicy.fcfs(), priority_weights=PriorityWeights(job_size=100)
    )
    assert placed_jobs(run_cycle(snap, large_first)) == {2}
    small_first = dataclasses.replace(
        large_first, priority_weights=PriorityWeights(job_size=100, favor_small=True)
    )
    assert placed_jobs(run_cycle(snap, small_first)) == {1}


def test_the_age_factor_lets_an_old_job_pass_a_newer_higher_priority_one():
    old = job(1, gpu=1, priority=0, created_at=NOW - 2 * DAY)
    new = job(2, gpu=1, priority=1, created_at=NOW - 60)
    snap = snapshot([node("n", gpus=1)], [old, new])
    weights = PriorityWeights(age=1000, priority=100, max_age=7 * DAY)
    config = dataclasses.replace(SchedulingPolicy.fcfs(), priority_weights=weights)
    assert placed_jobs(run_cycle(snap, config)) == {1}  # 285.7 + 0 > 0.1 + 100
    assert placed_jobs(run_cycle(snap, SchedulingPolicy.fcfs())) == {2}


def test_preemption_still_needs_a_higher_own_priority():
    """Fair share orders jobs; it never lets a light user evict anyone."""
    running = owned(job(1, gpu=1, running_on=[("n", (0,))], priority=0), "heavy")
    waiting = owned(job(2, gpu=1, priority=0), "light")
    snap = snapshot([node("n", gpus=1)], [running, waiting])
    snap.usage = {"heavy": 1e6}
    config = dataclasses.replace(SchedulingPolicy(), priority_weights=FAIR)
    assert run_cycle(snap, config).evictions == []


def test_the_pending_jobs_factors_are_returned_with_the_decisions():
    j = owned(job(1, gpu=1, priority=2, created_at=NOW - DAY), "a")
    blocker = owned(job(2, gpu=1, running_on=[("n", (0,))]), "b")
    snap = snapshot([node("n", gpus=1)], [blocker, j])
    snap.usage = {"a": 100.0, "b": 100.0}
    weights = PriorityWeights(age=700, fair_share=1000, priority=10, max_age=7 * DAY)
    result = run_cycle(snap, dataclasses.replace(SchedulingPolicy.easy(), priority_weights=weights))
    f = result.factors[1].as_dict()
    assert f == {"priority": 620.0, "age": 0.1429, "fair_share": 0.5, "job_size": 0.0,
                 "queue": 0.0, "job_priority": 2}  # fmt: skip


# --- factors off: decisions byte-identical to before ---------------------------------------

OFF = PriorityWeights(max_age=3600.0)  # every weight 0: "factors off"


@pytest.mark.parametrize("policy", ["easy", "fcfs"])
def test_factors_off_replays_the_kth_log_exactly_as_before(policy):
    jobs, recorded = kth_trace()
    nodes, queues = kth_cluster()
    base = SchedulingPolicy.easy() if policy == "easy" else SchedulingPolicy.fcfs()
    config = dataclasses.replace(base, priority_weights=OFF)
    jobs = [dataclasses.replace(j, owner=f"u{j.id % 7}") for j in jobs]
    assert schedule(jobs, replay(jobs, nodes, queues, config)) == recorded[policy]


def test_factors_off_replays_a_gpu_trace_exactly_as_before():
    import json

    recorded = json.loads((FIXTURES / "generated_800_schedule.json").read_text())
    jobs = generated_trace(14, 800)
    nodes, queues = generated_cluster()
    config = dataclasses.replace(SchedulingPolicy.easy(), priority_weights=OFF)
    assert schedule(jobs, replay(jobs, nodes, queues, config)) == recorded["schedules"]["easy"]


def test_factors_on_change_the_kth_schedule():
    """The equality above is not vacuous: with weights the order does move."""
    jobs, recorded = kth_trace()
    nodes, queues = kth_cluster()
    config = dataclasses.replace(
        SchedulingPolicy.easy(), priority_weights=PriorityWeights(job_size=1000)
    )
    assert schedule(jobs, replay(jobs, nodes, queues, config)) != recorded["easy"]


# --- per-user running limits ----------------------------------------------------------------

LIMITED = QueueInfo("default", max_user_gpus=2, max_user_jobs=3, max_user_cpus=8000)


@pytest.mark.parametrize(
    ("queue", "running", "asks", "placed", "message"),
    [
        (LIMITED, [1, 1], dict(gpu=1), False, "running GPUs 2/2"),
        (LIMITED, [1], dict(gpu=1), True, ""),
        (LIMITED, [0, 0, 0], dict(gpu=0, cpu=1), False, "running jobs 3/3"),
        (LIMITED, [0], dict(gpu=0, cpu=8), False, "running CPUs 1/8"),
        (QueueInfo("default"), [1, 1, 1], dict(gpu=1), True, ""),
        (dataclasses.replace(LIMITED, limits_exempt=frozenset({"a"})), [1, 1], dict(gpu=1),
         True, ""),
    ],
)  # fmt: skip
def test_it_holds_a_job_at_its_owners_running_limit(queue, running, asks, placed, message):
    held = [
        owned(job(10 + i, gpu=g, running_on=[("n", tuple(range(i * 1, i * 1 + g)))]), "a")
        for i, g in enumerate(running)
    ]
    mine = owned(job(1, **asks), "a")
    other = owned(job(2, gpu=1), "b")  # someone else's job is not held by a's limit
    snap = snapshot([node("n", gpus=8, cpu=64)], [*held, mine, other], [queue])
    result = run_cycle(snap, SchedulingPolicy())
    assert (1 in placed_jobs(result)) == placed
    assert 2 in placed_jobs(result)
    if not placed:
        assert result.pending[1].code == "UserLimit"
        assert message in result.pending[1].message


def test_the_limit_counts_what_the_cycle_itself_starts():
    jobs = [owned(job(i, gpu=1), "a") for i in range(1, 5)]
    snap = snapshot([node("n", gpus=8)], jobs, [QueueInfo("default", max_user_gpus=2)])
    result = run_cycle(snap, SchedulingPolicy.easy())
    assert placed_jobs(result) == {1, 2}
    assert result.pending[3].code == result.pending[4].code == "UserLimit"


def test_a_user_limited_job_does_not_hold_up_other_users_in_backfill():
    """Alike jobs of two owners: the first owner's refusal is not taken for the second's."""
    blocker = owned(job(1, gpu=8, walltime=None), "c")
    a_jobs = [owned(job(i, gpu=1), "a") for i in range(2, 5)]
    b_job = owned(job(9, gpu=1), "b")
    running = owned(job(20, gpu=2, running_on=[("n", (0, 1))]), "a")
    queue = QueueInfo("default", max_user_gpus=2)
    snap = snapshot([node("n", gpus=4)], [running, blocker, *a_jobs, b_job], [queue])
    result = run_cycle(snap, SchedulingPolicy.easy())
    assert 9 in placed_jobs(result)
    assert {result.pending[i].code for i in (2, 3, 4)} == {"UserLimit"}


@pytest.mark.parametrize(
    ("owner", "walltime", "backfilled"),
    [
        ("c", None, False),  # the holder's owner, running for as long as nobody knows
        ("c", 3000.0, False),  # past the reservation's start
        # Ends before the holder starts, but meanwhile the holder would wait on c's limit,
        # holding no reservation, and the nodes kept for it could go to others.
        ("c", 30.0, False),
        ("d", None, True),  # another user: not counted against c's limit
    ],
)
def test_backfill_never_takes_the_room_the_reserved_job_needs_under_its_owners_limit(
    owner, walltime, backfilled
):
    """c's 4-CPU job holds the reservation (a node of 4 CPUs frees in 60 s) and c may run 4
    CPUs in the queue: a 1-CPU job of c's backfilled on the free node now would still hold
    1 of those 4 when the reservation starts, and the holder would wait on c's limit
    (Hypothesis found this in test_it_never_lets_a_backfilled_job_delay_the_reservation)."""
    queue = QueueInfo("default", max_user_cpus=4000)
    running = owned(
        job(1, cpu=4, walltime=160.0, running_on=[("big", ())], started_at=NOW - 100), "a"
    )
    holder = owned(job(2, cpu=4, walltime=None), "c")
    small = owned(job(3, cpu=1, walltime=walltime), owner)
    snap = snapshot([node("big", cpu=4), node("free", cpu=1)], [running, holder, small], [queue])
    result = run_cycle(snap, SchedulingPolicy.easy())
    assert result.pending[2].code == "Reserved"
    assert result.pending[2].estimated_start == NOW + 60
    assert (3 in placed_jobs(result)) == backfilled
    if not backfilled:
        assert result.pending[3].code == "UserLimit"
        assert "with what its reserved job will need" in result.pending[3].message
