"""Inline flow steps are checked at submit as jobs are; resubmit makes fresh copies, for the
owner and staff only."""

from __future__ import annotations

import pytest

from scheduler.models import Event, Flow, FlowStep, Job, JobTemplate

pytestmark = pytest.mark.django_db

TASK = {"name": "main", "command": "run", "resources": {"cpu": 1}}


def step(name: str, **fields: object) -> dict[str, object]:
    return {"name": name, "spec": {"tasks": [TASK]}, **fields}


def flow_with(third: dict[str, object]) -> dict[str, object]:
    return {"name": "f", "steps": [step("a"), step("b", depends_on=["a"]), third]}


@pytest.mark.parametrize(
    ("third", "field", "words"),
    [
        (
            step("c", spec={"tasks": [{**TASK, "resources": {"gpu": 5000}}]}),
            "steps.2.spec.tasks.0.resources.gpu",
            "at most",
        ),
        (step("c", spec={"tasks": [{**TASK, "colour": "red"}]}), "steps.2.spec.tasks.0.colour",
         "unknown field"),
        (step("c", spec={"name": "x", "tasks": [TASK]}), "steps.2.spec.name", "takes its name"),
        (step("c", spec={"array": "0-3", "tasks": [TASK]}), "steps.2.spec.array", "items"),
        (step("c", spec="run"), "steps.2.spec", "must be a job spec"),
        (step("c", spec={"tasks": [TASK], "queue": "nowhere"}), "steps.2.spec.queue",
         'unknown queue "nowhere"'),
        (step("c", template="prep"), "steps.2", "either template or spec, not both"),
        ({"name": "c"}, "steps.2.template", "is required (or spec"),
        (step("c", spec={"tasks": [TASK], "priority": 10**6}), "steps.2.spec.priority",
         "at most"),
        (step("c", overrides={"resources": {"gpu": -1}}), "steps.2.overrides.resources.gpu", ""),
    ],
)  # fmt: skip
def test_a_bad_inline_step_is_refused_naming_the_field(api, owner, staff, third, field, words):
    JobTemplate.objects.create(name="prep", spec={"tasks": [TASK]})
    response = api(owner).post("/api/v1/flows/", flow_with(third), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert any(words in m for m in errors[field]), errors[field]
    assert not Flow.objects.exists() and not FlowStep.objects.exists()


def test_an_inline_step_is_stored_normalized(api, owner):
    spec = {
        "name": "f",
        "steps": [step("a", spec={"tasks": [{**TASK, "resources": {"memory": "1024Mi"}}]})],
    }
    response = api(owner).post("/api/v1/flows/", spec, format="json")
    assert response.status_code == 201, response.content
    stored = FlowStep.objects.get()
    assert stored.template is None and stored.spec is not None
    assert stored.spec["queue"] == "default"
    assert stored.spec["tasks"][0]["resources"]["memory"] == "1Gi"


def test_a_job_is_resubmitted_as_a_fresh_copy_by_its_owner_or_staff(api, owner, teammate, staff):
    client = api(owner)
    spec = {"name": "train", "labels": {"team": "vision"}, "tasks": [TASK]}
    original = client.post("/api/v1/jobs/", spec, format="json").json()
    Job.objects.filter(pk=original["id"]).update(state="Failed")

    response = client.post(f"/api/v1/jobs/{original['id']}/resubmit/")
    assert response.status_code == 201, response.content
    copy = response.json()
    assert copy["id"] != original["id"] and copy["state"] == "Pending"
    assert (copy["owner"], copy["name"], copy["labels"]) == ("alice", "train", {"team": "vision"})
    assert copy["spec"] == original["spec"]
    assert Event.objects.filter(job_id=copy["id"], kind="JobResubmitted").exists()

    assert api(teammate).post(f"/api/v1/jobs/{original['id']}/resubmit/").status_code == 404
    assert api(None).post(f"/api/v1/jobs/{original['id']}/resubmit/").status_code in (401, 403)
    # Staff may resubmit it; the copy is still the owner's (docs/security.md).
    by_staff = api(staff).post(f"/api/v1/jobs/{original['id']}/resubmit/")
    assert by_staff.status_code == 201 and by_staff.json()["owner"] == "alice"
    assert Job.objects.filter(name="train").count() == 3
    assert Job.objects.get(pk=original["id"]).state == "Failed"  # untouched


def test_a_flow_is_resubmitted_as_a_fresh_copy_by_its_owner_or_staff(api, owner, teammate, staff):
    client = api(owner)
    original = client.post("/api/v1/flows/", flow_with(step("c")), format="json").json()
    response = client.post(f"/api/v1/flows/{original['id']}/resubmit/")
    assert response.status_code == 201, response.content
    copy = response.json()
    assert copy["id"] != original["id"] and copy["state"] == "Pending"
    assert copy["spec"] == original["spec"] and copy["owner"] == "alice"
    assert [s["name"] for s in copy["steps"]] == ["a", "b", "c"]

    assert api(teammate).post(f"/api/v1/flows/{original['id']}/resubmit/").status_code == 404
    assert api(teammate).post(f"/api/v1/flows/{original['id']}/retry/").status_code == 404
    by_staff = api(staff).post(f"/api/v1/flows/{original['id']}/resubmit/")
    assert by_staff.status_code == 201 and by_staff.json()["owner"] == "alice"
    assert Flow.objects.count() == 3


def test_a_template_flow_is_resubmitted_with_its_items_and_overrides(api, owner, staff):
    JobTemplate.objects.create(name="train", spec={"tasks": [TASK]})
    spec = {"name": "sweep", "parallelism": 2, "fail_fast": True, "steps": [
        {"name": "train", "template": "train", "overrides": {"walltime": 60},
         "items": [{"LR": "0.1"}, {"LR": "0.01"}]},
        {"name": "eval", "spec": {"tasks": [TASK]}, "depends_on": ["train"]},
    ]}  # fmt: skip
    original = api(owner).post("/api/v1/flows/", spec, format="json").json()
    response = api(owner).post(f"/api/v1/flows/{original['id']}/resubmit/")
    assert response.status_code == 201, response.content
    copy = Flow.objects.get(pk=response.json()["id"])
    assert (copy.parallelism, copy.fail_fast, copy.spec) == (2, True, original["spec"])
    train = copy.steps.get(name="train")
    assert train.template is not None and train.template.name == "train"
    assert (train.overrides, train.items) == ({"walltime": 60}, [{"LR": "0.1"}, {"LR": "0.01"}])
