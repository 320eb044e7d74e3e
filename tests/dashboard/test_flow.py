"""The flow page: ownership, the DAG drawn as SVG, the step table and the jobs' output."""

from __future__ import annotations

import pytest

from scheduler.jobs.submit import create_flow
from scheduler.models import Flow, Job, JobTemplate, Task, TaskLog
from scheduler.states.names import JobState

pytestmark = pytest.mark.django_db


def _flow(owner):
    JobTemplate.objects.create(name="t", spec={"tasks": [{"name": "main", "command": "x"}]})
    return create_flow(owner, {"name": "f", "steps": [
        {"name": "a", "template": "t"},
        {"name": "b", "template": "t", "depends_on": ["a"], "items": [{"X": "1"}, {"X": "2"}]},
    ]})  # fmt: skip


@pytest.mark.parametrize(("who", "status"), [("owner", 200), ("teammate", 404),
                                             ("outsider", 404), ("staff", 200)])  # fmt: skip
def test_it_belongs_to_its_owner_and_staff(request, signed_in, owner, who, status):
    flow = Flow.objects.create(name="f", owner=owner, spec={})
    client = signed_in(request.getfixturevalue(who))
    assert client.get(f"/flows/{flow.pk}/").status_code == status
    assert client.post(f"/flows/{flow.pk}/cancel/").status_code == (302 if status == 200
                                                                    else 404)  # fmt: skip
    assert Flow.objects.get(pk=flow.pk).cancel_requested == (status == 200)


def test_it_draws_the_dag_with_edges_and_fan_out_counts(owner, signed_in):
    flow = _flow(owner)
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()
    assert "<svg" in html and 'data-step="a"' in html and 'data-step="b"' in html
    assert "×2" in html and "0/2 done" in html and '<path d="M' in html
    assert html.count('class="seg j-none"') == 2  # two items, no job yet
    assert f'ws-connect="/ws/flows/{flow.pk}/"' in html and f'id="flow-{flow.pk}-dag"' in html


def test_fan_out_segments_follow_their_jobs(owner, signed_in):
    from scheduler.flows.controller import reconcile_flows

    flow = _flow(owner)
    reconcile_flows()
    Job.objects.filter(flow=flow, step__name="a").update(state=JobState.SUCCEEDED)
    reconcile_flows()
    reconcile_flows()
    first = Job.objects.filter(flow=flow, step__name="b").order_by("item_index").first()
    assert first is not None
    Job.objects.filter(pk=first.pk).update(state=JobState.RUNNING)
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()
    assert 'data-step="a" data-state="Succeeded"' in html
    assert 'class="seg j-running"' in html and "1 running" in html
    assert 'class="edge done"' in html


def test_it_shows_the_latest_output_of_its_jobs_labelled(owner, signed_in):
    from scheduler.flows.controller import reconcile_flows

    flow = _flow(owner)
    reconcile_flows()
    task = Task.objects.get(job__flow=flow)
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="fetching\nready")
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()
    assert f'id="flow-{flow.pk}-log"' in html
    assert "f-a/main-0  fetching\nf-a/main-0  ready\n" in html
