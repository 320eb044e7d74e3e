"""The flow page explains itself: why each waiting step waits, DAG nodes that open their jobs,
and the retry and resubmit buttons."""

from __future__ import annotations

import pytest

from scheduler.flows.controller import reconcile_flows
from scheduler.jobs.submit import create_flow
from scheduler.models import Flow, Job
from scheduler.states.names import JobState

pytestmark = pytest.mark.django_db
SPEC = {"tasks": [{"name": "main", "command": "x", "resources": {"gpu": 4}}]}


def _flow(owner):
    flow = create_flow(owner, {"name": "f", "parallelism": 1, "steps": [
        {"name": "a", "spec": SPEC},
        {"name": "c", "spec": SPEC},
        {"name": "b", "spec": SPEC, "depends_on": ["a", "c"], "items": [{"X": "1"}, {"X": "2"}]},
    ]})  # fmt: skip
    reconcile_flows()
    return flow


def _waits(html: str, step: str) -> str:
    start = html.index(f'data-waiting="{step}">') + len(f'data-waiting="{step}">')
    return html[start : html.index("</div>", start)]


def test_each_waiting_step_says_why(owner, signed_in):
    flow = _flow(owner)
    released = flow.jobs.get(hold_reason="")
    held = flow.jobs.exclude(hold_reason="").get()
    # What the scheduler last said about the released job (resources).
    Job.objects.filter(pk=released.pk).update(pending_message="0/2 nodes have 4 free GPUs")
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()

    assert _waits(html, "b") == "waits: waiting for steps a, c to succeed"
    assert _waits(html, released.step.name) == (
        f"waits: job {released.pk}: 0/2 nodes have 4 free GPUs"
    )
    assert _waits(html, held.step.name) == (
        f"waits: job {held.pk}: waiting for a parallelism slot (1/1 active in flow f)"
    )
    # The graph's tooltips say it too.
    assert "b: Pending — 0/2 done — waiting for steps a, c to succeed</title>" in html


def test_the_api_gives_the_same_reasons(owner, api):
    flow = _flow(owner)
    steps = api(owner).get(f"/api/v1/flows/{flow.pk}/").json()["steps"]
    waiting = {s["name"]: s["waiting"] for s in steps}
    assert waiting["b"] == "waiting for steps a, c to succeed"
    assert "waiting for a parallelism slot" in " ".join(waiting.values())


def test_dag_nodes_link_to_their_jobs(owner, signed_in):
    flow = _flow(owner)
    Job.objects.filter(flow=flow).update(state=JobState.SUCCEEDED)
    reconcile_flows()
    reconcile_flows()
    html = signed_in(owner).get(f"/flows/{flow.pk}/").content.decode()
    svg = html[html.index("<svg") : html.index("</svg>")]
    for job in flow.jobs.all():
        assert f'<a href="/jobs/{job.pk}/"' in svg, job.step.name
    assert flow.jobs.filter(step__name="b").count() == 2  # the fan-out's segments link too


def test_a_failed_flow_offers_retry_and_the_retry_runs_it_again(owner, signed_in):
    flow = _flow(owner)
    Job.objects.filter(flow=flow).update(state=JobState.FAILED)
    reconcile_flows()
    flow.refresh_from_db()
    assert flow.state == "Failed"
    client = signed_in(owner)
    html = client.get(f"/flows/{flow.pk}/").content.decode()
    assert f'action="/flows/{flow.pk}/retry/"' in html and "Retry failed steps" in html

    response = client.post(f"/flows/{flow.pk}/retry/", HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Redirect"] == f"/flows/{flow.pk}/"
    flow.refresh_from_db()
    assert flow.state == "Running"
    html = client.get(f"/flows/{flow.pk}/").content.decode()
    assert "Retry failed steps" not in html
    # Retrying again is refused with the reason on the page.
    response = client.post(f"/flows/{flow.pk}/retry/")
    assert "only a Failed flow can be retried" in response.content.decode()


def test_resubmit_opens_the_new_flow_and_strangers_get_404(owner, teammate, signed_in):
    flow = _flow(owner)
    assert signed_in(teammate).post(f"/flows/{flow.pk}/resubmit/").status_code == 404
    assert signed_in(teammate).post(f"/flows/{flow.pk}/retry/").status_code == 404
    response = signed_in(owner).post(f"/flows/{flow.pk}/resubmit/")
    new = Flow.objects.exclude(pk=flow.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/flows/{new.pk}/"
    assert new.owner == owner and new.spec == flow.spec
