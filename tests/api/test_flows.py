"""/api/v1/flows/ and /api/v1/templates/: create, validate, own, cancel, delete."""

from __future__ import annotations

import pytest

from scheduler.jobs.submit import submit_job
from scheduler.models import Flow, FlowStep, Job, JobTemplate
from scheduler.states.names import FlowState

pytestmark = pytest.mark.django_db

TEMPLATE_SPEC = {"tasks": [{"name": "main", "command": "echo $LR", "resources": {"cpu": 1}}]}


@pytest.fixture
def templates(staff):
    for name in ("prep", "train", "eval"):
        JobTemplate.objects.create(name=name, spec=TEMPLATE_SPEC, owner=staff)


FLOW = {
    "name": "sweep",
    "parallelism": 2,
    "fail_fast": True,
    "steps": [
        {"name": "prep", "template": "prep"},
        {"name": "train", "template": "train", "depends_on": ["prep"],
         "items": [{"LR": "0.1"}, {"LR": "0.01"}]},
        {"name": "eval", "template": "eval", "depends_on": ["train"]},
    ],
}  # fmt: skip


def test_it_creates_a_flow_with_its_steps(api, owner, templates):
    response = api(owner).post("/api/v1/flows/", FLOW, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "Pending" and body["owner"] == "alice"
    assert [(s["name"], s["state"], s["jobs"]) for s in body["steps"]] == [
        ("prep", "Pending", []), ("train", "Pending", []), ("eval", "Pending", []),
    ]  # fmt: skip
    assert body["steps"][1]["items"] == 2


def _flow(**changes):
    return {**FLOW, **changes}


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            _flow(steps=[{"name": "a", "template": "prep"}, {"name": "a", "template": "train"}]),
            "steps.1.name",
            "repeats the name of step 0",
        ),
        (
            _flow(steps=[{"name": "a", "template": "prep", "depends_on": ["ghost"]}]),
            "steps.0.depends_on",
            "unknown step 'ghost'",
        ),
        (
            _flow(steps=[
                {"name": "a", "template": "prep", "depends_on": ["c"]},
                {"name": "b", "template": "prep", "depends_on": ["a"]},
                {"name": "c", "template": "prep", "depends_on": ["b"]},
            ]),
            "steps",
            "cycle a -> c -> b -> a",
        ),
        (_flow(parallelism=0), "parallelism", "at least 1"),
        (
            _flow(steps=[{"name": "a", "template": "prep", "items": ["x", "y"]}]),
            "steps.0.items.0",
            "must be an object",
        ),
        (
            _flow(steps=[{"name": "a", "template": "prep", "items": {"LR": 1}}]),
            "steps.0.items",
            "list of objects",
        ),
        (
            _flow(steps=[{"name": "a", "template": "nope"}]),
            "steps.0.template",
            'unknown template "nope"',
        ),
        (
            _flow(steps=[{"name": "a", "template": "prep", "overrides": {"colour": 1}}]),
            "steps.0.overrides.colour",
            "unknown field",
        ),
    ],
)  # fmt: skip
def test_it_rejects_a_bad_flow_and_creates_nothing(api, owner, templates, spec, field, words):
    response = api(owner).post("/api/v1/flows/", spec, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert field in errors, errors
    assert any(words in m for m in errors[field]), errors[field]
    assert not Flow.objects.exists() and not FlowStep.objects.exists() and not Job.objects.exists()


def test_a_flow_lists_only_its_own_jobs(api, owner, templates):
    """Two flows from the same templates never see each other's jobs."""
    client = api(owner)
    a = Flow.objects.get(pk=client.post("/api/v1/flows/", FLOW, format="json").json()["id"])
    b = Flow.objects.get(pk=client.post("/api/v1/flows/", FLOW, format="json").json()["id"])
    template = JobTemplate.objects.get(name="prep")
    for flow in (a, b):
        step = flow.steps.get(name="prep")
        submit_job(owner, {"name": f"{flow.pk}-prep", **TEMPLATE_SPEC}, flow=flow, step=step,
                   template=template)  # fmt: skip
    a_jobs = client.get(f"/api/v1/flows/{a.pk}/").json()["steps"][0]["jobs"]
    b_jobs = client.get(f"/api/v1/flows/{b.pk}/").json()["steps"][0]["jobs"]
    assert a_jobs == list(a.jobs.values_list("id", flat=True))
    assert set(a_jobs).isdisjoint(b_jobs) and len(b_jobs) == 1
    assert client.get(f"/api/v1/jobs/?flow={a.pk}").json()["count"] == 1
    job = Job.objects.get(pk=a_jobs[0])
    assert job.labels == {"berth/flow": str(a.pk), "berth/template": "prep", "berth/step": "prep"}


def test_deleting_a_finished_flow_leaves_another_flows_jobs(api, owner, templates):
    client = api(owner)
    ids = [client.post("/api/v1/flows/", FLOW, format="json").json()["id"] for _ in range(2)]
    flows = [Flow.objects.get(pk=i) for i in ids]
    for flow in flows:
        submit_job(owner, {"name": "x", **TEMPLATE_SPEC}, flow=flow, step=flow.steps.first())
    assert client.delete(f"/api/v1/flows/{ids[0]}/").status_code == 409  # still Pending
    Flow.objects.filter(pk=ids[0]).update(state=FlowState.SUCCEEDED)
    assert client.delete(f"/api/v1/flows/{ids[0]}/").status_code == 204
    assert not Job.objects.filter(flow_id=ids[0]).exists()
    assert Job.objects.filter(flow_id=ids[1]).count() == 1


def test_it_records_a_flow_cancel(api, owner, templates):
    client = api(owner)
    flow_id = client.post("/api/v1/flows/", FLOW, format="json").json()["id"]
    response = client.post(f"/api/v1/flows/{flow_id}/cancel/")
    assert response.status_code == 202 and response.json()["cancel_requested"]
    kinds = [e["kind"] for e in client.get(f"/api/v1/flows/{flow_id}/events/").json()["results"]]
    assert kinds == ["FlowCancelRequested", "FlowCreated"]


@pytest.mark.parametrize(
    ("who", "status"),
    [("owner", 200), ("teammate", 404), ("outsider", 404), ("staff", 200), (None, None)],
)
@pytest.mark.parametrize("suffix", ["", "events/"])
def test_only_the_owner_and_staff_reach_a_flow(api, request, owner, templates, who, status,
                                               suffix):  # fmt: skip
    flow_id = api(owner).post("/api/v1/flows/", FLOW, format="json").json()["id"]
    user = request.getfixturevalue(who) if who else None
    response = api(user).get(f"/api/v1/flows/{flow_id}/{suffix}")
    cancel = api(user).post(f"/api/v1/flows/{flow_id}/cancel/")
    if who is None:
        assert response.status_code in (401, 403) and cancel.status_code in (401, 403)
    else:
        assert response.status_code == status
        assert cancel.status_code == (202 if status == 200 else 404)
    if status == 404:
        assert not Flow.objects.get(pk=flow_id).cancel_requested


def test_templates_are_read_by_all_and_written_by_staff(api, owner, staff):
    body = {"name": "train", "description": "GPU training", "spec": TEMPLATE_SPEC}
    assert api(owner).post("/api/v1/templates/", body, format="json").status_code == 403
    created = api(staff).post("/api/v1/templates/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["spec"]["tasks"][0]["resources"]["cpu"] == "1"
    assert api(owner).get("/api/v1/templates/train/").json()["description"] == "GPU training"
    again = api(staff).post("/api/v1/templates/", body, format="json")
    assert again.status_code == 400 and "name" in again.json()
    changed = {**body, "description": "changed"}
    assert api(staff).put("/api/v1/templates/train/", changed, format="json").status_code == 200
    assert api(owner).delete("/api/v1/templates/train/").status_code == 403
    assert api(staff).delete("/api/v1/templates/train/").status_code == 204


def test_a_bad_template_spec_is_named(api, staff):
    body = {"name": "t", "spec": {"tasks": [{"command": "x", "resources": {"gpu": -1}}]}}
    errors = api(staff).post("/api/v1/templates/", body, format="json").json()
    assert "spec.tasks.0.resources.gpu" in errors
    assert not JobTemplate.objects.exists()
