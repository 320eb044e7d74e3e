"""The jobs list: filters, search, count-free keyset pages, only the user's own jobs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Job, Queue
from scheduler.states.names import JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_it_lists_only_the_users_jobs_and_staff_see_all(owner, outsider, staff, signed_in):
    make_job(owner, "mine")
    make_job(outsider, "theirs")
    html = signed_in(owner).get("/jobs/").content.decode()
    assert "mine" in html and "theirs" not in html
    html = signed_in(staff).get("/jobs/").content.decode()
    assert "mine" in html and "theirs" in html


def test_it_pages_by_id_newest_first(owner, signed_in):
    for i in range(55):
        make_job(owner, f"job-{i}")
    client = signed_in(owner)
    first = client.get("/jobs/").content.decode()
    assert "job-54" in first and "job-4<" not in first and "Older jobs" in first
    assert "Newest" not in first
    oldest = Job.objects.filter(owner=owner).order_by("id")[4].pk
    older = client.get(f"/jobs/?before={oldest + 1}").content.decode()
    assert "job-4<" in older and "job-5<" not in older and "Newest" in older


def test_a_page_costs_no_count_over_all_jobs(owner, signed_in):
    for i in range(60):
        make_job(owner, f"job-{i}")
    client = signed_in(owner)
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/jobs/?state=Pending").status_code == 200
    assert not [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert any("LIMIT 51" in q["sql"] for q in queries.captured_queries)


def test_it_filters_by_state_queue_owner_flow_and_search(owner, staff, signed_in):
    Queue.objects.create(name="research")
    make_job(owner, "alpha")
    make_job(owner, "beta", queue="research")
    Job.objects.filter(name="alpha").update(state=JobState.RUNNING)
    client = signed_in(owner)
    htmx = client.get("/jobs/?state=Running", HTTP_HX_REQUEST="true").content.decode()
    assert "alpha" in htmx and "beta" not in htmx and "<html" not in htmx
    assert "beta" in client.get("/jobs/?queue=research").content.decode()
    assert "alpha" not in client.get("/jobs/?queue=research").content.decode()
    assert "beta" in client.get("/jobs/?q=bet").content.decode()
    beta = Job.objects.get(name="beta")
    by_id = client.get(f"/jobs/?q={beta.pk}").content.decode()
    assert "beta" in by_id and "alpha" not in by_id
    assert "alpha" not in signed_in(staff).get("/jobs/?owner=nobody").content.decode()
    assert "No jobs match" in client.get("/jobs/?flow=999").content.decode()


def test_a_pending_row_says_why_it_waits(owner, signed_in):
    make_job(owner, "waiting", pending_code="WaitingForResources",
             pending_message="0/3 nodes fit: 3 insufficient gpu")  # fmt: skip
    html = signed_in(owner).get("/jobs/").content.decode()
    assert "0/3 nodes fit: 3 insufficient gpu" in html and 'ws-connect="/ws/jobs/"' in html
