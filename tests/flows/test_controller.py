"""The flow controller against the database: isolation, parallelism, fail-fast, cancel, TTL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler import lifecycle
from scheduler.flows.controller import reconcile_flows
from scheduler.flows.ttl import cleanup_flows
from scheduler.jobs.submit import create_flow
from scheduler.models import Allocation, Event, Flow, Job, JobTemplate, Task
from scheduler.states.names import JobState, TaskState
from tests.factories import finish_task, make_node, place

pytestmark = pytest.mark.django_db
SPEC = {"tasks": [{"name": "main", "command": "run", "resources": {"cpu": 1, "gpu": 1}}]}


@pytest.fixture(autouse=True)
def templates(staff):
    for name in ("prep", "train", "eval"):
        JobTemplate.objects.create(name=name, spec=SPEC)


def sweep(owner, name="sweep", items=4, parallelism=2, fail_fast=True):
    return create_flow(owner, {
        "name": name, "parallelism": parallelism, "fail_fast": fail_fast,
        "steps": [
            {"name": "prep", "template": "prep"},
            {"name": "train", "template": "train", "depends_on": ["prep"],
             "items": [{"LR": str(i)} for i in range(items)]},
            {"name": "eval", "template": "eval", "depends_on": ["train"]},
        ],
    })  # fmt: skip


def active(flow):
    return list(flow.jobs.filter(state__in=("Pending", "Running"), hold_reason=""))


def finish(job, state=JobState.SUCCEEDED, message=""):
    Job.objects.filter(pk=job.pk).update(state=state, finished_at=timezone.now(), message=message)


def run_to_end(flow, fail=(), limit=60):
    """Finish the flow's released jobs one by one as the scheduler and agents would."""
    most = 0
    for _ in range(limit):
        reconcile_flows()
        flow.refresh_from_db()
        if flow.state in ("Succeeded", "Failed", "Cancelled"):
            return most
        now_active = active(flow)
        most = max(most, len(now_active))
        for job in now_active[:1]:
            bad = job.name in fail
            finish(
                job, JobState.FAILED if bad else JobState.SUCCEEDED, "exit code 1" if bad else ""
            )
    raise AssertionError(f"flow {flow.pk} did not finish: {flow.state}")


def test_two_flows_from_the_same_templates_never_see_each_others_jobs(owner):
    a, b = sweep(owner, "a"), sweep(owner, "b")
    reconcile_flows()
    run_to_end(a)
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.state == "Succeeded"
    assert b.state == "Running"  # a's finished jobs did not finish b
    a_jobs = set(a.jobs.values_list("id", flat=True))
    b_jobs = set(b.jobs.values_list("id", flat=True))
    assert a_jobs and b_jobs and a_jobs.isdisjoint(b_jobs)
    assert len(a_jobs) == 6  # prep, four train items, eval
    assert all(j.labels["berth/flow"] == str(a.pk) for j in a.jobs.all())
    a_events = set(Event.objects.filter(flow=a).values_list("id", flat=True))
    assert a_events.isdisjoint(Event.objects.filter(flow=b).values_list("id", flat=True))
    run_to_end(b)
    b.refresh_from_db()
    assert b.state == "Succeeded"
    a.delete()
    assert Job.objects.filter(pk__in=b_jobs).count() == len(b_jobs)


def test_parallelism_caps_active_jobs_and_never_stalls(owner):
    flow = sweep(owner, items=10, parallelism=3)
    most = run_to_end(flow)
    flow.refresh_from_db()
    assert flow.state == "Succeeded" and most == 3
    assert flow.jobs.count() == 12


def test_a_held_job_says_it_waits_for_a_parallelism_slot(owner, api):
    flow = sweep(owner, items=4, parallelism=1)
    reconcile_flows()
    finish(flow.jobs.get(step__name="prep"))
    reconcile_flows()
    reconcile_flows()
    held = flow.jobs.exclude(hold_reason="").order_by("id").first()
    assert held is not None
    reasons = api(owner).get(f"/api/v1/jobs/{held.pk}/").json()["pending_reasons"]
    assert reasons[0] == "waiting for a parallelism slot (1/1 active in flow sweep)"


def test_fail_fast_stops_the_flow_and_frees_its_devices(owner):
    node = make_node("gpu-01", gpus=4)
    flow = sweep(owner, items=4, parallelism=2)
    reconcile_flows()
    finish(flow.jobs.get(step__name="prep"))
    reconcile_flows()
    reconcile_flows()
    first, second = active(flow)
    for job in (first, second):
        place(job, node, devices=1)
    failing = flow.jobs.get(pk=first.pk)
    finish_task(failing.tasks.get(), TaskState.FAILED, 1)
    lifecycle.sync_jobs()  # the job fails for good (no retries)

    reconcile_flows()
    survivor = Job.objects.get(pk=second.pk)
    assert survivor.state == JobState.TERMINATING
    assert survivor.tasks.get().kill_requested
    assert not flow.jobs.filter(state="Pending").exists()  # held items were cancelled
    finish_task(survivor.tasks.get(), TaskState.KILLED)  # the agent confirms
    lifecycle.sync_jobs()
    reconcile_flows()

    flow.refresh_from_db()
    assert flow.state == "Failed"
    assert f"step train job {failing.name} (id {failing.pk}) failed" in flow.message
    steps = dict(flow.steps.values_list("name", "state"))
    assert steps == {"prep": "Succeeded", "train": "Failed", "eval": "Skipped"}
    assert not flow.jobs.filter(state__in=("Pending", "Running", "Terminating")).exists()
    assert not Task.objects.filter(job__flow=flow, state__in=("Assigned", "Running")).exists()
    assert not Allocation.objects.exists()


def test_without_fail_fast_the_other_items_finish(owner):
    flow = sweep(owner, items=4, parallelism=2, fail_fast=False)
    run_to_end(flow, fail={"sweep-train-1"})
    flow.refresh_from_db()
    assert flow.state == "Failed"
    train = flow.jobs.filter(step__name="train")
    assert sorted(train.values_list("state", flat=True)) == ["Failed"] + ["Succeeded"] * 3
    assert dict(flow.steps.values_list("name", "state"))["eval"] == "Skipped"


def test_cancel_stops_every_job_of_the_flow(owner):
    flow = sweep(owner)
    reconcile_flows()
    Flow.objects.filter(pk=flow.pk).update(cancel_requested=True)
    reconcile_flows()
    reconcile_flows()
    flow.refresh_from_db()
    assert flow.state == "Cancelled"
    assert set(flow.jobs.values_list("state", flat=True)) == {"Cancelled"}


def test_ttl_deletes_only_the_expired_flow_and_its_own_jobs(owner):
    old, young = sweep(owner, "old"), sweep(owner, "young")
    reconcile_flows()
    for flow, ago in ((old, 120), (young, 10)):
        Flow.objects.filter(pk=flow.pk).update(
            state="Succeeded", ttl_seconds_after_finished=60,
            finished_at=timezone.now() - timedelta(seconds=ago),
        )  # fmt: skip
    young_jobs = set(young.jobs.values_list("id", flat=True))
    assert cleanup_flows(timezone.now()) == 1
    assert not Flow.objects.filter(pk=old.pk).exists()
    assert not Job.objects.filter(flow_id=old.pk).exists()
    assert set(Job.objects.filter(flow=young).values_list("id", flat=True)) == young_jobs


def test_a_template_that_makes_no_valid_job_fails_its_step(owner):
    flow = sweep(owner)
    # Broken after the flow was accepted (create_flow refuses a flow it already makes no job for).
    JobTemplate.objects.filter(name="prep").update(spec={"tasks": [{"command": ""}]})
    reconcile_flows()
    flow.refresh_from_db()
    assert flow.state == "Failed" and "prep" in flow.message
    assert not flow.jobs.exists()
