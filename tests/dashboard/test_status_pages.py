"""The job page and the jobs list say why a job waits: its status code and message, nodes per
reason, and a "never fits" mark distinct from waiting for resources."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import make_job

pytestmark = pytest.mark.django_db
NEVER: dict[str, Any] = {
    "pending_code": "NeverFits",
    "pending_message": "0/2 nodes fit: 2 insufficient gpu",
    "pending_node_reasons": {"insufficient gpu": 2},
}
WAITING: dict[str, Any] = {
    "pending_code": "WaitingForResources",
    "pending_message": "0/2 nodes fit: 2 busy",
    "pending_node_reasons": {"busy": 2},
}


def test_a_job_that_never_fits_is_marked_on_its_page(owner, signed_in):
    job = make_job(owner, **NEVER)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert 'class="badge never-fits"' in html and "0/2 nodes fit: 2 insufficient gpu" in html
    assert "2 nodes: insufficient gpu" in html


def test_a_job_waiting_for_resources_is_not_marked(owner, signed_in):
    job = make_job(owner, **WAITING)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "WaitingForResources" in html and "never-fits" not in html
    assert "2 nodes: busy" in html


def test_the_jobs_list_marks_never_fits_and_shows_other_codes(owner, signed_in):
    never = make_job(owner, "never", **NEVER)
    waiting = make_job(owner, "waiting", **WAITING)
    held = make_job(owner, "held", hold_reason="array limit: 2/2 active")
    html = signed_in(owner).get("/jobs/").content.decode()
    rows = {j.pk: html.split(f'id="job-row-{j.pk}"')[1].split("</tr>")[0]
            for j in (never, waiting, held)}  # fmt: skip
    assert "never fits" in rows[never.pk] and 'title="0/2 nodes fit' in rows[never.pk]
    assert "WaitingForResources" in rows[waiting.pk] and "never fits" not in rows[waiting.pk]
    assert "Held" in rows[held.pk] and "array limit: 2/2 active" in rows[held.pk]
