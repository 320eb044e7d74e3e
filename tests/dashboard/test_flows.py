"""The flows list: the user's own flows with their job counts."""

from __future__ import annotations

import pytest

from scheduler.models import Flow, Job
from scheduler.states.names import JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_it_lists_the_users_flows_with_job_counts(owner, outsider, staff, signed_in):
    mine = Flow.objects.create(name="mine", owner=owner, spec={})
    Flow.objects.create(name="theirs", owner=outsider, spec={})
    for state in (JobState.SUCCEEDED, JobState.RUNNING, JobState.FAILED):
        job = make_job(owner, f"j-{state.lower()}")
        Job.objects.filter(pk=job.pk).update(flow=mine, state=state)
    html = signed_in(owner).get("/flows/").content.decode()
    assert "mine" in html and "theirs" not in html
    assert "1/3 done" in html and "1 running" in html and "1 failed" in html
    assert "theirs" in signed_in(staff).get("/flows/").content.decode()
