"""Nothing tells a user whether another user's job or flow exists, and nobody acts on another
user's objects: lookups and filters answer 404 exactly as for an id that was never used."""

from __future__ import annotations

import pytest

from scheduler.models import Event, Flow, JobTemplate
from scheduler.states.names import FlowState
from tests.factories import make_job

pytestmark = pytest.mark.django_db

NEVER_USED = 987_654


@pytest.fixture
def flow_of(staff):
    JobTemplate.objects.create(
        name="t", spec={"tasks": [{"name": "main", "command": "true"}]}, owner=staff
    )

    def make(user, state: str = FlowState.RUNNING) -> Flow:
        flow = Flow.objects.create(name="f", owner=user, spec={}, state=state)
        Event.objects.create(kind="FlowCreated", flow=flow)
        return flow

    return make


def test_events_of_another_users_job_answer_404_like_the_job(api, owner, outsider):
    theirs = make_job(outsider)
    Event.objects.create(kind="JobSubmitted", job=theirs)
    client = api(owner)
    for job_id in (theirs.pk, NEVER_USED):
        by_filter = client.get(f"/api/v1/events/?job={job_id}")
        by_job = client.get(f"/api/v1/jobs/{job_id}/")
        assert (by_filter.status_code, by_job.status_code) == (404, 404)
        assert by_filter.json() == by_job.json()


def test_events_of_another_users_flow_answer_404_like_the_flow(api, owner, outsider, flow_of):
    theirs = flow_of(outsider)
    client = api(owner)
    for flow_id in (theirs.pk, NEVER_USED):
        by_filter = client.get(f"/api/v1/events/?flow={flow_id}")
        by_flow = client.get(f"/api/v1/flows/{flow_id}/")
        assert (by_filter.status_code, by_flow.status_code) == (404, 404)
        assert by_filter.json() == by_flow.json()


def test_the_owner_and_staff_filter_events_by_job_and_flow(api, owner, staff, flow_of):
    job = make_job(owner)
    Event.objects.create(kind="JobSubmitted", job=job)
    flow = flow_of(owner)
    for user in (owner, staff):
        client = api(user)
        by_job = client.get(f"/api/v1/events/?job={job.pk}").json()["results"]
        assert [e["kind"] for e in by_job] == ["JobSubmitted"]
        by_flow = client.get(f"/api/v1/events/?flow={flow.pk}").json()["results"]
        assert [e["kind"] for e in by_flow] == ["FlowCreated"]


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "１"])
def test_a_bad_job_or_flow_filter_is_named(api, owner, value):
    for name in ("job", "flow"):
        response = api(owner).get(f"/api/v1/events/?{name}={value}")
        assert response.status_code == 400 and name in response.json()


def test_a_huge_id_is_simply_not_found(api, owner):
    for name in ("job", "flow"):
        assert api(owner).get(f"/api/v1/events/?{name}={'9' * 30}").status_code == 404


def test_nobody_deletes_another_users_flow(api, owner, outsider, flow_of):
    theirs = flow_of(outsider, state=FlowState.SUCCEEDED)
    assert api(owner).delete(f"/api/v1/flows/{theirs.pk}/").status_code == 404
    assert Flow.objects.filter(pk=theirs.pk).exists()
    assert api(outsider).delete(f"/api/v1/flows/{theirs.pk}/").status_code == 204


def test_nobody_resumes_another_users_job(api, owner, outsider):
    theirs = make_job(outsider, state="Suspended", reason="UserSuspended")
    assert api(owner).post(f"/api/v1/jobs/{theirs.pk}/resume/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.requested_action == ""


def test_users_cannot_change_or_delete_templates(api, owner, flow_of):
    body = {"name": "t", "spec": {"priority": 100, "tasks": [{"command": "true"}]}}
    assert api(owner).put("/api/v1/templates/t/", body, format="json").status_code == 403
    assert api(owner).delete("/api/v1/templates/t/").status_code == 403
    assert "priority" not in str(JobTemplate.objects.get(name="t").spec)
