"""Job arrays on the pages: one row in the jobs list that expands, the parent's element panel."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.queries import cluster_summary
from scheduler.jobs.submit import submit_job
from scheduler.models import Job
from scheduler.states.names import JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def make_array(owner: Any, array: str = "0-149%5") -> Job:
    return submit_job(owner, {"name": "sweep", "array": array,
                              "tasks": [{"command": "echo $BERTH_ARRAY_INDEX"}]})  # fmt: skip


def test_the_jobs_list_shows_an_array_as_one_row_that_expands(owner, signed_in):
    parent = make_array(owner)
    make_job(owner, "plain")
    client = signed_in(owner)
    html = client.get("/jobs/").content.decode()
    assert f"{parent.pk}_[0-149%5]" in html and "plain" in html
    assert html.count('id="job-row-') == 2  # the parent and the plain job, no element
    assert f'hx-get="/jobs/{parent.pk}/elements/"' in html and "150 elements" in html
    assert "150 pending" in html  # the parent's summary in "why"

    Job.objects.filter(array_parent=parent, array_index__lt=5).update(state=JobState.RUNNING)
    expanded = client.get(f"/jobs/{parent.pk}/elements/", HTTP_HX_REQUEST="true").content
    fragment = expanded.decode()
    assert fragment.startswith(f'\n<tr id="job-elements-{parent.pk}"') and "<html" not in fragment
    assert fragment.count('id="job-row-') == 100  # a page of elements, in index order
    assert f">{parent.pk}_0<" in fragment and f">{parent.pk}_99<" in fragment
    assert f">{parent.pk}_100<" not in fragment and "after index 99" in fragment
    assert "array limit: 5/5 active" in fragment

    more = client.get(f"/jobs/{parent.pk}/elements/?panel=1&after=99").content.decode()
    assert more.count('id="job-row-') == 50 and f">{parent.pk}_149<" in more
    running = client.get(f"/jobs/{parent.pk}/elements/?panel=1&state=Running").content.decode()
    assert running.count('id="job-row-') == 5
    closed = client.get(f"/jobs/{parent.pk}/elements/?collapsed=1").content.decode()
    assert f'id="job-elements-{parent.pk}"' in closed and "hidden" in closed


def test_an_element_is_found_by_its_id(owner, signed_in):
    parent = make_array(owner, "0-2")
    element = Job.objects.get(array_parent=parent, array_index=1)
    html = signed_in(owner).get(f"/jobs/?q={element.pk}").content.decode()
    assert f">{parent.pk}_1<" in html


def test_the_parents_page_lists_its_elements_and_an_elements_page_its_array(owner, signed_in):
    parent = make_array(owner, "0-3")
    client = signed_in(owner)
    html = client.get(f"/jobs/{parent.pk}/").content.decode()
    assert 'aria-label="array elements"' in html and html.count('id="job-row-') == 4
    assert "Suspend" not in html and "Cancel" in html  # suspend is per element
    assert 'aria-label="tasks"' not in html and "array <b>0-3</b>" in html
    element = Job.objects.get(array_parent=parent, array_index=2)
    html = client.get(f"/jobs/{element.pk}/").content.decode()
    assert f'element <b>2</b> of array <a href="/jobs/{parent.pk}/">' in html


def test_another_users_array_is_404(owner, outsider, signed_in):
    parent = make_array(owner, "0-3")
    client = signed_in(outsider)
    assert client.get(f"/jobs/{parent.pk}/elements/").status_code == 404
    assert client.get(f"/jobs/{parent.pk}/").status_code == 404
    plain = make_job(owner, "plain")
    assert signed_in(owner).get(f"/jobs/{plain.pk}/elements/").status_code == 404


def test_the_cluster_summary_counts_elements_not_the_parent(owner, signed_in):
    make_array(owner, "0-3")
    assert cluster_summary()["pending"] == 4
