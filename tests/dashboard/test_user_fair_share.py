"""The job page shows a waiting job's priority factors (as sprio); the usage page has a fair
share panel (as sshare): your own line, everyone's for staff."""

from __future__ import annotations

import pytest

from tests.factories import make_job, make_usage

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_fair_share")]

FACTORS = {
    "priority": 5123.4,
    "factors": {"age": 0.1234, "fair_share": 0.5, "job_size": 0.0, "queue": 0.0,
                "job_priority": 0},
    "weighted": {"age": 123.4, "fair_share": 5000.0, "job_size": 0.0, "queue": 0.0,
                 "job_priority": 0.0},
}  # fmt: skip


def test_the_job_page_shows_a_waiting_jobs_factors(owner, signed_in):
    job = make_job(owner, pending_code="WaitingForResources", pending_message="no GPU free",
                   priority_factors=FACTORS)  # fmt: skip
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert f'id="job-{job.pk}-factors"' in page
    assert "5123.4" in page and "5000.0" in page and "(0.5)" in page


def test_the_usage_page_shows_fair_share_per_user(owner, teammate, staff, signed_in):
    make_usage(owner, gpu_seconds=3600.0)
    make_usage(teammate, gpu_seconds=3600.0)
    everyone = signed_in(staff).get("/usage/").content.decode()
    assert 'id="fair-share"' in everyone
    assert "alice" in everyone and "bob" in everyone
    mine = signed_in(owner).get("/usage/").content.decode()
    panel = mine.split('id="fair-share"')[1]
    assert "alice" in panel and "bob" not in panel
