"""POST /api/v1/jobs/<id>/extend/ and `berth extend` (docs/interactive.md#time-limits-and-
extending): a running job's owner adds time up to the queue's max_walltime, unless a waiting
job's reservation would start later for it (409 naming that job)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from berth.cli import main
from scheduler.models import Event, Job, Queue
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def _extend(client, job: Job, by: object):
    return client.post(f"/api/v1/jobs/{job.pk}/extend/", {"by": by}, format="json")


@pytest.fixture
def running(owner) -> Job:
    """A job holding both GPUs of the only node, for 600 s."""
    node = make_node("gpu-1", gpus=2)
    job = make_job(owner, "notebook", gpu=2, walltime=600)
    place(job, node, devices=2)
    return job


def test_the_owner_extends_a_running_job_when_nothing_waits(api, owner, running):
    response = _extend(api(owner), running, "30m")
    assert response.status_code == 200, response.content
    assert response.json()["walltime"] == 600 + 1800
    running.refresh_from_db()
    assert (running.walltime, running.spec["walltime"]) == (2400, 2400)
    event = Event.objects.get(job=running, kind="WalltimeExtended")
    assert "by 1800 s to 2400 s (by alice)" in event.message


def test_an_extension_that_would_delay_a_reservation_is_refused_naming_the_job(
    api, owner, teammate, running
):
    waiting = make_job(teammate, "waits", gpu=2, walltime=300)  # starts when `running` ends
    response = _extend(api(owner), running, 600)
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert f"would delay the reservation of job {waiting.pk}" in detail
    assert "600 s later" in detail
    running.refresh_from_db()
    assert running.walltime == 600  # nothing written


def test_a_waiting_job_that_fits_beside_it_does_not_stop_an_extension(api, owner, running):
    other = make_node("gpu-2", gpus=1)
    assert other.pk
    make_job(owner, "small", gpu=1, walltime=300)  # runs on gpu-2 now, whatever happens
    assert _extend(api(owner), running, 600).status_code == 200


def test_the_queues_max_walltime_bounds_extensions_and_submissions(api, owner, running):
    Queue.objects.filter(name="default").update(max_walltime=900)
    response = _extend(api(owner), running, 600)
    assert response.status_code == 409
    assert "at most 900 s (max_walltime)" in response.json()["detail"]
    assert "grow by at most 300 s" in response.json()["detail"]
    assert _extend(api(owner), running, 300).json()["walltime"] == 900
    spec = {"name": "long", "walltime": 901, "tasks": [{"name": "m", "command": "true"}]}
    refused = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert refused.status_code == 400 and "walltime" in refused.json()
    del spec["walltime"]
    assert api(owner).post("/api/v1/jobs/", spec, format="json").json()["walltime"] == 900


def test_only_a_running_job_with_a_walltime_of_yours(api, owner, outsider, running):
    assert _extend(api(outsider), running, 60).status_code == 404
    assert _extend(api(None), running, 60).status_code in (401, 403)
    pending = make_job(owner, "pending", walltime=60)
    assert "only a running job" in _extend(api(owner), pending, 60).json()["detail"]
    Job.objects.filter(pk=running.pk).update(walltime=None)
    assert "has no walltime" in _extend(api(owner), running, 60).json()["detail"]
    Job.objects.filter(pk=pending.pk).update(state=JobState.SUCCEEDED)
    assert _extend(api(owner), pending, 60).status_code == 409


@pytest.mark.parametrize("by", [None, "soon", 0, -5, "9" * 40, True, [60]])
def test_a_bad_amount_is_a_400_naming_by(api, owner, running, by):
    response = _extend(api(owner), running, by)
    assert response.status_code == 400, response.content
    assert "by" in response.json()


def test_berth_extend_posts_the_amount_and_says_the_new_walltime(monkeypatch):
    posted = []

    class Api:
        def post(self, path: str, body: object = None) -> dict:
            posted.append((path, body))
            return {"id": 5, "walltime": 5400}

    monkeypatch.setattr(main, "client", Api)
    result = CliRunner().invoke(main.cli, ["extend", "5", "--by", "30m"])
    assert result.exit_code == 0, result.output
    assert posted == [("jobs/5/extend/", {"by": "30m"})]
    assert "walltime now 5400 s" in result.output


def test_a_running_job_shows_when_its_walltime_runs_out(api, owner, running, client):
    body = api(owner).get(f"/api/v1/jobs/{running.pk}/").json()
    assert body["walltime_ends_at"] is not None
    client.force_login(owner)
    page = client.get(f"/jobs/{running.pk}/").content.decode()
    ends = int(running.walltime_ends_at.timestamp())
    assert f'data-ends="{ends}"' in page and "remaining.js" in page
    _extend(api(owner), running, 60)
    running.refresh_from_db()
    assert int(running.walltime_ends_at.timestamp()) == ends + 60
    pending = make_job(owner, "later", walltime=60)
    assert api(owner).get(f"/api/v1/jobs/{pending.pk}/").json()["walltime_ends_at"] is None


def test_berth_show_says_how_long_is_left(monkeypatch):
    class Api:
        def get(self, path: str) -> dict:
            return {"id": 5, "state": "Running", "walltime_ends_at": "2999-01-01T00:00:00Z",
                    "tasks": []}  # fmt: skip

    monkeypatch.setattr(main, "client", Api)
    result = CliRunner().invoke(main.cli, ["show", "5"])
    assert result.exit_code == 0, result.output
    assert "remaining: " in result.output and "left (until 2999-01-01T00:00:00Z)" in result.output
