"""EASY++ runtime predictions on the server (issue #21): each user's last finished run times
feed the snapshot's jobs when BERTH_RUNTIME_PREDICTIONS is on (off: nothing changes), the
plan phase's estimates follow them, and the API, `berth show` and the job page say which
the estimate was planned by."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from django.contrib.auth.models import User
from django.utils import timezone

from berth.cli import main
from scheduler.cycle import predictions
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.cycle.snapshot import load_snapshot
from scheduler.models import Job
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(predictions, "HISTORY", predictions.RuntimeHistory())


def finished(owner: User, seconds: float, ago: float = 60.0) -> Job:
    """A job of `owner` that ran `seconds` and ended `ago` seconds ago."""
    end = timezone.now() - timedelta(seconds=ago)
    return make_job(
        owner, "done", state=JobState.SUCCEEDED, started_at=end - timedelta(seconds=seconds),
        finished_at=end,
    )  # fmt: skip


def predicted(job: Job) -> float | None:
    return next(j.predicted for j in load_snapshot().snapshot.jobs if j.id == job.pk)


def test_off_by_default_no_job_carries_a_prediction(owner):
    finished(owner, 100, ago=300)
    finished(owner, 300)
    assert predicted(make_job(owner, walltime=3600)) is None


def test_it_predicts_from_each_users_last_two_finished_jobs(owner, teammate, settings):
    settings.BERTH_RUNTIME_PREDICTIONS = True
    finished(owner, 5000, ago=900)  # older than the last two: not counted
    finished(owner, 100, ago=300)
    finished(owner, 300)
    finished(teammate, 9000)
    make_job(owner, "never ran", state=JobState.CANCELLED, finished_at=timezone.now())
    newcomer = User.objects.create_user("cy")
    assert predicted(make_job(owner, walltime=3600)) == 200.0
    assert predicted(make_job(teammate, walltime=3600)) == 3600.0  # capped by the walltime
    assert predicted(make_job(newcomer, walltime=1800)) == 1800.0  # no history: the walltime
    assert predicted(make_job(owner)) is None  # no walltime: none


def test_it_catches_up_with_jobs_finished_since_in_one_query(
    owner, settings, django_assert_num_queries
):
    settings.BERTH_RUNTIME_PREDICTIONS = True
    finished(owner, 100, ago=300)
    waiting = make_job(owner, walltime=3600)
    assert predicted(waiting) == 100.0
    finished(owner, 500, ago=1)
    jobs = load_snapshot().snapshot.jobs
    with django_assert_num_queries(1):
        predictions.HISTORY.predict(jobs)
    assert next(j.predicted for j in jobs if j.id == waiting.pk) == 300.0


def _one_runs_one_waits(owner: Any) -> tuple[Job, Job, float]:
    """A one-GPU job runs on the only GPU for up to an hour and another waits for it; after a
    cycle: both, and in how many seconds the waiting one is estimated to start."""
    node = make_node("n1", gpus=1)
    running = make_job(owner, "runs", gpu=1, walltime=3600)
    place(running, node, devices=1)
    waiting = make_job(owner, "waits", gpu=1, walltime=3600)
    run_scheduler_cycle()
    waiting.refresh_from_db()
    assert waiting.estimated_start_at is not None
    return running, waiting, (waiting.estimated_start_at - timezone.now()).total_seconds()


def test_the_estimate_follows_the_prediction_and_says_so(owner, settings, api, client):
    settings.BERTH_RUNTIME_PREDICTIONS = True
    finished(owner, 60)
    finished(owner, 60)
    _, waiting, left = _one_runs_one_waits(owner)
    assert 0 < left <= 60  # by its prediction, not in an hour
    body = api(owner).get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert body["estimate_basis"] == "prediction"
    client.force_login(owner)
    html = client.get(f"/jobs/{waiting.pk}/").content.decode()
    assert "by runtime predictions" in html


def test_without_predictions_the_estimate_says_walltimes(owner, api, client):
    running, waiting, left = _one_runs_one_waits(owner)
    assert left > 3000
    assert api(owner).get(f"/api/v1/jobs/{waiting.pk}/").json()["estimate_basis"] == "walltime"
    client.force_login(owner)
    assert "by walltimes" in client.get(f"/jobs/{waiting.pk}/").content.decode()
    assert api(owner).get(f"/api/v1/jobs/{running.pk}/").json()["estimate_basis"] is None


@pytest.mark.parametrize(
    ("basis", "said"), [("prediction", "(by runtime predictions)"), ("walltime", "(by walltimes)")]
)
def test_berth_show_says_what_the_estimate_was_planned_by(monkeypatch, basis, said):
    soon = (timezone.now() + timedelta(minutes=5)).isoformat()
    job = {"id": 2, "name": "b", "owner": "alice", "queue": "default", "state": "Pending",
           "queue_position": 1, "estimated_start_at": soon, "estimate_basis": basis,
           "tasks": []}  # fmt: skip

    class Client:
        def get(self, path: str, **params: object) -> dict[str, object]:
            return job

    monkeypatch.setattr(main, "client", Client)
    out = CliRunner().invoke(main.cli, ["show", "2"]).output
    assert said in out


def test_a_job_past_its_prediction_is_not_killed_until_its_walltime(owner, settings):
    settings.BERTH_RUNTIME_PREDICTIONS = True
    finished(owner, 60)
    node = make_node("n1", gpus=1)
    running = make_job(owner, "runs", gpu=1, walltime=3600)
    place(running, node, devices=1)
    long_ago = timezone.now() - timedelta(seconds=600)  # ten times its prediction
    Job.objects.filter(pk=running.pk).update(started_at=long_ago)
    running.tasks.update(started_at=long_ago)
    run_scheduler_cycle()
    running.refresh_from_db()
    assert running.state == JobState.RUNNING
    Job.objects.filter(pk=running.pk).update(started_at=long_ago - timedelta(seconds=3600))
    running.tasks.update(started_at=long_ago - timedelta(seconds=3600))
    run_scheduler_cycle()
    running.refresh_from_db()
    assert running.state != JobState.RUNNING  # past its own walltime: stopped
