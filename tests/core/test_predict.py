"""EASY++ runtime predictions (issue #21): the rule (last two finished run times of the same
user, capped by the walltime, raised when outlived, the walltime without history) and what
it changes in backfill, reservations and start estimates; kills stay at the walltime."""

from __future__ import annotations

import pytest

from scheduler.core import predict
from scheduler.core.cycle import run_cycle
from scheduler.core.model import NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plan import plan_starts
from scheduler.core.predict import History, raised
from scheduler.core.replay import TraceJob, replay
from scheduler.core.resources import Resources
from scheduler.core.standing import StandingSession
from scheduler.core.status import Code
from tests.core.builders import NOW, job, node, placed_jobs, snapshot

EASY = SchedulingPolicy.easy()


@pytest.mark.parametrize(
    ("history", "walltime", "expected"),
    [
        ((), 3600.0, 3600.0),  # no history: the walltime
        ((100.0,), 3600.0, 100.0),  # one finished job: its run time
        ((100.0, 300.0), 3600.0, 200.0),  # the mean of the last two
        ((5000.0, 100.0, 300.0), 3600.0, 200.0),  # only the last two count
        ((5000.0, 7000.0), 3600.0, 3600.0),  # capped by the walltime
        ((0.0, 0.0), 3600.0, 0.0),  # jobs that ran no time predict none
        ((100.0, 300.0), None, None),  # no walltime: nothing to plan an end by
    ],
)
def test_it_predicts_the_mean_of_the_users_last_two_runs_capped_by_the_walltime(
    history, walltime, expected
):
    assert predict.predict(history, walltime) == expected


def test_the_history_keeps_each_users_last_two_runs_apart():
    history = History()
    for owner, ran in [("ann", 100.0), ("bob", 9000.0), ("ann", 300.0), ("ann", 500.0)]:
        history.finished(owner, ran)
    assert history.predict("ann", 3600.0) == 400.0
    assert history.predict("bob", 3600.0) == 3600.0  # capped
    assert history.predict("cy", 1800.0) == 1800.0  # never ran anything: the walltime


@pytest.mark.parametrize(
    ("prediction", "elapsed", "walltime", "correction", "expected"),
    [
        (600.0, 599.0, 7200.0, "walltime", 600.0),  # not outlived: as it was
        (600.0, 600.0, 7200.0, "walltime", 7200.0),  # outlived: the walltime
        (600.0, 600.0, 7200.0, "stepwise", 900.0),  # the next step above what it ran
        (900.0, 950.0, 7200.0, "stepwise", 1800.0),
        (3600.0, 3600.0, 5000.0, "stepwise", 5000.0),  # steps stop at the walltime
        (7200.0, 7300.0, 7200.0, "walltime", 7200.0),  # at the walltime: nothing to raise
        (200.0, 400000.0, 500000.0, "stepwise", 500000.0),  # past the last step
    ],
)
def test_it_raises_a_prediction_the_job_outlived(
    prediction, elapsed, walltime, correction, expected
):
    assert raised(prediction, elapsed, walltime, correction) == expected


@pytest.mark.parametrize(
    ("predicted", "now", "correction", "expected"),
    [
        (None, 5000.0, "walltime", 7200.0),  # planned by its walltime
        (600.0, 100.0, "walltime", 600.0),
        (600.0, 600.0, "walltime", 7200.0),
        (600.0, 1000.0, "stepwise", 1800.0),  # 900 outlived too: raised twice
        (600.0, 8000.0, "stepwise", 7200.0),  # past its walltime: never past it
    ],
)
def test_a_running_jobs_planned_end_is_raised_as_often_as_it_was_outlived(
    predicted, now, correction, expected
):
    running = job(1, walltime=7200.0, predicted=predicted)
    assert predict.end(running, 0.0, now, correction) == expected


def _blocked_cluster(predicted: float | None) -> list:
    """n1 is busy until its job's walltime (NOW + 3500); the wide job 2 needs both nodes and
    holds the reservation; job 3 fits on n2 now, asks for 2 h and is predicted `predicted`."""
    running = job(1, cpu=8, running_on=[("n1", ())], walltime=3600.0)
    wide = job(2, cpu=8, replicas=2, walltime=3600.0)
    short = job(3, cpu=8, walltime=7200.0, predicted=predicted)
    return [running, wide, short]


def test_a_job_predicted_short_backfills_where_its_walltime_would_delay_the_reservation():
    nodes = [node("n1"), node("n2")]
    by_walltime = run_cycle(snapshot(nodes, _blocked_cluster(None)), EASY)
    assert placed_jobs(by_walltime) == set()
    assert by_walltime.pending[3].code == Code.RESERVED_FOR_OTHER
    by_prediction = run_cycle(snapshot(nodes, _blocked_cluster(600.0)), EASY)
    assert placed_jobs(by_prediction) == {3}  # NOW + 600 is before the reservation
    assert by_prediction.pending[2].estimated_start == NOW + 3500
    assert by_prediction.evictions == []


def test_the_reservation_and_estimates_follow_running_jobs_predictions():
    """Job 1 is predicted to end 100 s from now, not at its walltime: the wide job's
    reservation and the plan's estimate say so, and the message says it was predicted."""
    nodes = [node("n1"), node("n2")]
    running = job(1, cpu=8, running_on=[("n1", ())], walltime=3600.0, predicted=200.0)
    jobs = [running, job(2, cpu=8, replicas=2, walltime=3600.0)]
    result = run_cycle(snapshot(nodes, jobs), EASY)
    assert result.pending[2].estimated_start == NOW + 100
    assert "predicted end" in result.pending[2].message
    assert plan_starts(snapshot(nodes, jobs), result, EASY).starts[2] == NOW + 100
    # Outlived (it has run 300 s): raised to its walltime, and the estimate with it.
    late = run_cycle(snapshot(nodes, jobs, now=NOW + 200), EASY)
    assert late.pending[2].estimated_start == NOW + 3500


def test_a_job_that_outlives_its_prediction_runs_on_until_its_own_end():
    """The kill stays at the walltime: in a replay the job predicted 600 s backfills, runs
    its 3,000 s (within its 7,200 s walltime) and is never stopped at its prediction; the
    wide job waits for it (the cost the paper accepts for a wrong prediction)."""
    cluster = [NodeInfo("n1", Resources(1000, 1 << 30)), NodeInfo("n2", Resources(1000, 1 << 30))]
    cpu = Resources(1000, 1 << 30)
    jobs = [
        TraceJob(1, 0.0, 1, cpu, 600.0, 600.0, owner="ann"),  # ann's history: 600 s
        TraceJob(2, 10.0, 1, cpu, 3600.0, 3600.0, owner="bob"),  # n2 busy until 3610
        TraceJob(3, 700.0, 2, cpu, 100.0, 3600.0, owner="cy"),  # wide: reserved at 3610
        TraceJob(4, 710.0, 1, cpu, 3000.0, 7200.0, owner="ann"),  # predicted 600 s
    ]
    result = replay(jobs, cluster, [QueueInfo("default")], EASY, predictions=True)
    assert result.predicted[4] == 600.0
    assert result.starts[4] == 710.0  # backfilled: 710 + 600 <= 3610
    assert result.starts[3] == 710.0 + 3000.0  # after job 4's whole run, not its prediction
    walltimes = replay(jobs, cluster, [QueueInfo("default")], EASY)
    assert walltimes.starts[4] == 3610.0 + 100.0  # by its walltime it would not fit before


def test_a_standing_session_raises_the_end_of_a_job_that_outlived_its_prediction():
    for correction, raised_to in (("walltime", 7200.0), ("stepwise", 900.0)):
        config = SchedulingPolicy(actions=EASY.actions, prediction_correction=correction)
        standing = StandingSession([node("n1")], [QueueInfo("default")], config)
        standing.submit(job(1, cpu=8, walltime=7200.0, predicted=600.0, preemptible=False))
        standing.cycle(0.0)
        assert [e[0] for e in standing.session.walltime_ends] == [600.0]
        standing.cycle(600.0)  # still running at its predicted end
        assert [e[0] for e in standing.session.walltime_ends] == [raised_to]


def test_an_unknown_prediction_correction_is_refused():
    with pytest.raises(ValueError, match="prediction_correction"):
        SchedulingPolicy(prediction_correction="double")
