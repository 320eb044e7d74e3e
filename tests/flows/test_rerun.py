"""Flows with inline steps run end to end; a failed flow's retry re-runs only what failed."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduler.flows.controller import reconcile_flows
from scheduler.jobs.submit import create_flow
from scheduler.models import Event, Flow, Job, JobTemplate
from scheduler.states.names import JobState

pytestmark = pytest.mark.django_db


def inline(command: str, gpu: int = 0) -> dict[str, object]:
    return {"tasks": [{"name": "main", "command": command, "resources": {"cpu": 1, "gpu": gpu}}]}


BRANCHES = {
    "name": "branches",
    "steps": [
        {"name": "left", "spec": inline("make left")},
        {"name": "left2", "spec": inline("make left2"), "depends_on": ["left"]},
        {"name": "right", "spec": inline("make right")},
        {"name": "right2", "spec": inline("make right2"), "depends_on": ["right"]},
    ],
}


def finish(job: Job, state: str) -> None:
    message = "exit code 1" if state == JobState.FAILED else ""
    Job.objects.filter(pk=job.pk).update(state=state, finished_at=timezone.now(), message=message)


def run_to_end(flow: Flow, fail: set[str] = frozenset(), rounds: int = 60) -> None:  # type: ignore[assignment]
    """Finish the flow's released jobs as the scheduler and agents would; jobs named in
    `fail` fail."""
    for _ in range(rounds):
        reconcile_flows()
        flow.refresh_from_db()
        if flow.state in ("Succeeded", "Failed", "Cancelled"):
            return
        for job in flow.jobs.filter(state="Pending", hold_reason="").order_by("id")[:1]:
            finish(job, JobState.FAILED if job.name in fail else JobState.SUCCEEDED)
    raise AssertionError(f"flow {flow.pk} did not finish: {flow.state}")


def create(api, owner, spec):
    response = api(owner).post("/api/v1/flows/", spec, format="json")
    assert response.status_code == 201, response.content
    return Flow.objects.get(pk=response.json()["id"])


def step_states(flow: Flow) -> dict[str, str]:
    return dict(flow.steps.values_list("name", "state"))


def test_an_inline_flow_runs_end_to_end_with_items_and_parallelism(api, owner):
    spec = {
        "name": "inline", "parallelism": 2,
        "steps": [
            {"name": "prep", "spec": inline("prepare")},
            {"name": "train", "spec": inline("train $LR"), "depends_on": ["prep"],
             "items": [{"LR": str(i)} for i in range(4)], "overrides": {"max_retry": 2}},
            {"name": "eval", "spec": inline("evaluate"), "depends_on": ["train"]},
        ],
    }  # fmt: skip
    flow = create(api, owner, spec)
    most = 0
    for _ in range(40):
        reconcile_flows()
        flow.refresh_from_db()
        if flow.state != "Running":
            break
        released = list(flow.jobs.filter(state="Pending", hold_reason=""))
        most = max(most, len(released))
        finish(released[0], JobState.SUCCEEDED)
    assert flow.state == "Succeeded" and most == 2
    train = flow.jobs.filter(step__name="train").order_by("item_index")
    assert [j.spec["tasks"][0]["env"] for j in train] == [{"LR": str(i)} for i in range(4)]
    assert all(j.spec["tasks"][0]["command"] == "train $LR" and j.max_retry == 2 for j in train)
    assert all(j.template is None for j in flow.jobs.all()) and flow.jobs.count() == 6
    body = api(owner).get(f"/api/v1/flows/{flow.pk}/").json()
    assert [(s["template"], s["inline"]) for s in body["steps"]] == [(None, True)] * 3


def test_a_step_may_mix_with_template_steps(api, owner, staff):
    JobTemplate.objects.create(name="prep", spec=inline("from template"))
    spec = {"name": "mixed", "steps": [
        {"name": "a", "template": "prep"},
        {"name": "b", "spec": inline("inline"), "depends_on": ["a"]},
    ]}  # fmt: skip
    flow = create(api, owner, spec)
    run_to_end(flow)
    assert flow.state == "Succeeded"
    commands = {j.step.name: j.spec["tasks"][0]["command"] for j in flow.jobs.all()}
    assert commands == {"a": "from template", "b": "inline"}


def test_retry_reruns_only_the_failed_branch(api, owner):
    flow = create(api, owner, BRANCHES)
    run_to_end(flow, fail={"branches-right"})
    assert flow.state == "Failed"
    assert step_states(flow) == {
        "left": "Succeeded", "left2": "Succeeded", "right": "Failed", "right2": "Skipped"
    }  # fmt: skip
    kept = {j.pk: (j.state, j.finished_at) for j in flow.jobs.filter(step__name__startswith="left")}
    failed = flow.jobs.get(step__name="right")

    response = api(owner).post(f"/api/v1/flows/{flow.pk}/retry/")
    assert response.status_code == 202, response.content
    assert response.json()["state"] == "Running"
    right_step = next(s for s in response.json()["steps"] if s["name"] == "right")
    assert right_step["state"] == "Pending"
    assert (right_step["jobs"], right_step["earlier_jobs"]) == ([], [failed.pk])
    run_to_end(flow)

    assert flow.state == "Succeeded", flow.message
    assert step_states(flow) == dict.fromkeys(("left", "left2", "right", "right2"), "Succeeded")
    # The succeeded branch was not run again: the same jobs, untouched.
    left = flow.jobs.filter(step__name__startswith="left")
    assert {j.pk: (j.state, j.finished_at) for j in left} == kept
    # The failed job stays for the record; one new job ran for each step that had not succeeded.
    right = flow.jobs.filter(step__name="right").order_by("id")
    assert [(j.pk, j.state) for j in right][0] == (failed.pk, "Failed")
    assert [j.state for j in right] == ["Failed", "Succeeded"]
    assert flow.jobs.filter(step__name="right2").count() == 1
    assert Event.objects.filter(flow=flow, kind="FlowRetried").exists()


def test_retry_keeps_the_succeeded_items_of_a_fan_out_step(api, owner):
    spec = {"name": "sweep", "steps": [
        {"name": "train", "spec": inline("train $LR"), "items": [{"LR": str(i)} for i in range(3)]},
        {"name": "eval", "spec": inline("evaluate"), "depends_on": ["train"]},
    ]}  # fmt: skip
    flow = create(api, owner, spec)
    run_to_end(flow, fail={"sweep-train-1"})
    assert flow.state == "Failed"
    before = {j.item_index: j.pk for j in flow.jobs.filter(step__name="train", state="Succeeded")}
    assert sorted(before) == [0, 2]

    assert api(owner).post(f"/api/v1/flows/{flow.pk}/retry/").status_code == 202
    run_to_end(flow)

    assert flow.state == "Succeeded"
    train = flow.jobs.filter(step__name="train")
    assert train.count() == 4  # three of the first attempt, one again for item 1
    again = train.order_by("-id").first()
    assert again is not None and again.item_index == 1 and again.state == "Succeeded"
    assert set(before.values()) <= set(train.values_list("id", flat=True))


def test_retry_of_a_flow_that_did_not_fail_is_a_conflict(api, owner):
    flow = create(api, owner, BRANCHES)
    response = api(owner).post(f"/api/v1/flows/{flow.pk}/retry/")
    assert response.status_code == 409
    assert "only a Failed flow can be retried" in response.json()["detail"]
    run_to_end(flow)
    assert flow.state == "Succeeded"
    response = api(owner).post(f"/api/v1/flows/{flow.pk}/retry/")
    assert response.status_code == 409 and "resubmit" in response.json()["detail"]


def test_a_later_step_that_makes_no_valid_job_fails_the_flow_for_good(api, owner, staff):
    JobTemplate.objects.create(name="later", spec=inline("later"))
    flow = create_flow(owner, {"name": "f", "steps": [
        {"name": "a", "spec": inline("first")},
        {"name": "b", "template": "later", "depends_on": ["a"]},
        {"name": "slow", "spec": inline("sleep 1000")},
    ]})  # fmt: skip
    reconcile_flows()
    # Broken after the flow was accepted (create_flow refuses a flow it makes no job for).
    JobTemplate.objects.filter(name="later").update(spec={"tasks": [{"command": ""}]})
    finish(flow.jobs.get(step__name="a"), JobState.SUCCEEDED)
    for _ in range(3):
        reconcile_flows()
    flow.refresh_from_db()
    assert (flow.state, flow.reason) == ("Failed", "InvalidJobSpec")
    assert step_states(flow) == {"a": "Succeeded", "b": "Failed", "slow": "Running"}
    assert Event.objects.filter(flow=flow, reason="InvalidJobSpec").count() == 1
    # A retry waits until the flow's other jobs have ended.
    response = api(owner).post(f"/api/v1/flows/{flow.pk}/retry/")
    assert response.status_code == 409 and "still has active jobs" in response.json()["detail"]
