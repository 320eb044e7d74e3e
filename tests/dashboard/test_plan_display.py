"""The jobs list and the job page show a waiting job's position in its queue and its start
estimate ("unknown" when there is none), as the scheduler's plan phase stored them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db

SOON = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_the_list_shows_position_and_start(owner, signed_in):
    first = make_job(owner, "first", queue_position=1, estimated_start_at=SOON)
    second = make_job(owner, "second", queue_position=2)
    html = signed_in(owner).get("/jobs/").content.decode()
    assert "pos · start" in html
    row = html[html.index(f'id="job-row-{first.pk}"') :]
    assert "#1 · " in row[: row.index("</tr>")] and "Jan 2 03:04" in row[: row.index("</tr>")]
    row = html[html.index(f'id="job-row-{second.pk}"') :]
    assert "#2 · unknown" in row[: row.index("</tr>")]


def test_the_job_page_shows_position_and_start(owner, signed_in):
    job = make_job(owner, "waiting", queue_position=3, estimated_start_at=SOON)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "Position in queue default: <b>3</b>" in html
    assert 'datetime="2030-01-02T03:04:05+00:00"' in html
    Job.objects.filter(pk=job.pk).update(estimated_start_at=None)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "Estimated start: unknown" in html


def test_a_running_job_shows_no_position(owner, signed_in):
    node = make_node("n1", gpus=1)
    job = make_job(owner, "runs", gpu=1)
    place(job, node, devices=1)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "Position in queue" not in html and "Estimated start" not in html


def test_the_plan_phase_fills_what_the_pages_show(owner, signed_in):
    node = make_node("n1", gpus=1)
    running = make_job(owner, "runs", gpu=1, walltime=600)
    place(running, node, devices=1)
    waiting = make_job(owner, "waits", gpu=1, walltime=60)
    run_scheduler_cycle()
    html = signed_in(owner).get(f"/jobs/{waiting.pk}/").content.decode()
    assert "Position in queue default: <b>1</b>" in html
    assert "Estimated start: <time" in html
