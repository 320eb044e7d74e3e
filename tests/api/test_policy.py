"""The priority policy: a queue's `max_user_priority` caps what non-staff users may ask for,
for jobs submitted directly and for flow steps' jobs; staff may set any. Preemption across
users follows priority, so it happens only within that policy."""

from __future__ import annotations

import pytest

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Event, Flow, Job, JobTemplate, Queue
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db

ONE_GPU = {"cpu": 1, "memory": "1Gi", "gpu": 1}


def job_spec(name: str = "train", **fields):
    return {"name": name, "tasks": [{"command": "true", "resources": ONE_GPU}], **fields}


def refusal(cap: int, got: int, queue: str = "default") -> str:
    return f'at most {cap} in queue "{queue}" for non-staff users, got {got}'


def test_a_user_asking_above_the_cap_gets_400_naming_priority_and_the_cap(api, owner):
    response = api(owner).post("/api/v1/jobs/", job_spec(priority=1_000_000), format="json")
    assert response.status_code == 400
    assert response.json() == {"priority": [refusal(0, 1_000_000)]}
    assert not Job.objects.exists()


def test_a_user_may_ask_up_to_the_cap_and_lower(api, owner):
    Queue.objects.filter(name="default").update(max_user_priority=10)
    client = api(owner)
    for priority in (10, 0, -5):
        response = client.post("/api/v1/jobs/", job_spec(priority=priority), format="json")
        assert response.status_code == 201, response.content
        assert response.json()["priority"] == priority
    assert client.post("/api/v1/jobs/", job_spec(priority=11), format="json").json() == {
        "priority": [refusal(10, 11)]
    }


def test_staff_may_set_any_priority(api, staff):
    response = api(staff).post("/api/v1/jobs/", job_spec(priority=1_000_000), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["priority"] == 1_000_000


def test_the_cap_is_per_queue(api, owner):
    Queue.objects.create(name="urgent", max_user_priority=100)
    client = api(owner)
    assert client.post("/api/v1/jobs/", job_spec(queue="urgent", priority=100),
                       format="json").status_code == 201  # fmt: skip
    response = client.post("/api/v1/jobs/", job_spec(priority=100), format="json")
    assert response.json() == {"priority": [refusal(0, 100)]}


def test_staff_set_the_cap_through_the_queue_api_and_users_cannot(api, owner, staff):
    assert api(owner).get("/api/v1/queues/default/").json()["max_user_priority"] == 0
    body = {"max_user_priority": 50}
    assert api(owner).patch("/api/v1/queues/default/", body, format="json").status_code == 403
    response = api(staff).patch("/api/v1/queues/default/", body, format="json")
    assert response.status_code == 200, response.content
    assert Queue.objects.get(name="default").max_user_priority == 50
    too_big = api(staff).patch("/api/v1/queues/default/", {"max_user_priority": 10**7},
                               format="json")  # fmt: skip
    assert too_big.status_code == 400 and "max_user_priority" in too_big.json()


# --- preemption across users -------------------------------------------------------------


def test_a_user_cannot_preempt_another_users_job_above_the_cap(api, owner, teammate):
    node = make_node("gpu-01", gpus=1)
    theirs = make_job(teammate, "theirs", gpu=1, priority=0)
    place(theirs, node, devices=1)

    response = api(owner).post("/api/v1/jobs/", job_spec("mine", priority=1_000_000),
                               format="json")  # fmt: skip
    assert response.status_code == 400
    report = run_scheduler_cycle()
    theirs.refresh_from_db()
    assert report.counts["preempted"] == 0
    assert theirs.state == JobState.RUNNING


def test_within_the_cap_a_higher_priority_preempts_as_before(api, owner, teammate):
    Queue.objects.filter(name="default").update(max_user_priority=10)
    node = make_node("gpu-01", gpus=1)
    theirs = make_job(teammate, "theirs", gpu=1, priority=0)
    place(theirs, node, devices=1)

    response = api(owner).post("/api/v1/jobs/", job_spec("mine", priority=10), format="json")
    assert response.status_code == 201, response.content
    report = run_scheduler_cycle()
    theirs.refresh_from_db()
    assert report.counts["preempted"] == 1
    assert (theirs.state, theirs.reason) == (JobState.SUSPENDED, "Preempted")


# --- flows: the template's priority, then the step's overrides ---------------------------


@pytest.fixture
def urgent_template(staff):
    """A template staff made for their own urgent work."""
    spec = {"priority": 500, "tasks": [{"name": "main", "command": "true", "resources": ONE_GPU}]}
    return JobTemplate.objects.create(name="urgent", spec=spec, owner=staff)


def flow_spec(**step):
    return {"name": "sweep", "steps": [{"name": "train", "template": "urgent", **step}]}


def test_a_users_flow_cannot_take_a_high_priority_from_a_staff_template(
    api, owner, urgent_template
):
    response = api(owner).post("/api/v1/flows/", flow_spec(), format="json")
    assert response.status_code == 400
    message = response.json()["steps.0.priority"][0]
    assert message.startswith(refusal(0, 500)) and 'template "urgent"' in message
    assert not Flow.objects.exists()


def test_a_users_flow_cannot_override_a_priority_above_the_cap(api, owner, urgent_template):
    body = flow_spec(overrides={"priority": 50})
    response = api(owner).post("/api/v1/flows/", body, format="json")
    assert response.status_code == 400
    assert response.json()["steps.0.priority"] == [f"{refusal(0, 50)} (from overrides.priority)"]


def test_a_users_flow_may_lower_the_templates_priority(api, owner, urgent_template):
    body = flow_spec(overrides={"priority": 0})
    response = api(owner).post("/api/v1/flows/", body, format="json")
    assert response.status_code == 201, response.content
    run_scheduler_cycle()
    assert Job.objects.get(flow_id=response.json()["id"]).priority == 0


def test_staff_flows_keep_the_templates_priority(api, staff, urgent_template):
    response = api(staff).post("/api/v1/flows/", flow_spec(), format="json")
    assert response.status_code == 201, response.content
    run_scheduler_cycle()
    assert Job.objects.get(flow_id=response.json()["id"]).priority == 500


def test_a_template_raised_after_the_flow_was_accepted_is_lowered_to_the_cap(
    api, owner, staff, urgent_template
):
    urgent_template.spec["priority"] = 0
    urgent_template.save()
    body = flow_spec(items=[{"LR": "0.1"}, {"LR": "0.01"}])
    flow_id = api(owner).post("/api/v1/flows/", body, format="json").json()["id"]
    raised = {"name": "urgent", "spec": {**urgent_template.spec, "priority": 500}}
    assert api(staff).put("/api/v1/templates/urgent/", raised, format="json").status_code == 200

    run_scheduler_cycle()
    jobs = list(Job.objects.filter(flow_id=flow_id))
    assert [j.priority for j in jobs] == [0, 0]
    assert [j.spec["priority"] for j in jobs] == [0, 0]
    lowered = Event.objects.filter(job__in=jobs, kind="PriorityLowered")
    assert [e.message for e in lowered] == [f"priority 500 lowered to 0: {refusal(0, 500)}"] * 2
    assert Flow.objects.get(pk=flow_id).state == "Running"
