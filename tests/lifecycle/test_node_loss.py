"""Deleting a node (REST, admin, or any other way) ends its tasks: they go Lost, their devices
are freed, and each job follows its retry policy — never Running or Terminating for ever."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Allocation, Event, Job, Node, Task
from scheduler.states.names import JobRequest, JobState, TaskState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def cycle_until(job: Job, *states: str, cycles: int = 5) -> Job:
    for _ in range(cycles):
        run_scheduler_cycle()
        job.refresh_from_db()
        if job.state in states:
            break
    return job


def test_a_job_with_a_retry_left_runs_again_on_another_node(api, owner, staff):
    first = make_node("gpu-01", gpus=1)
    job = make_job(owner, gpu=1, max_retry=1)
    place(job, first, devices=1)
    second = make_node("gpu-02", gpus=1)

    response = api(staff).delete("/api/v1/nodes/gpu-01/")
    assert response.status_code == 204
    assert not Node.objects.filter(name="gpu-01").exists()
    task = Task.objects.get(job=job)
    assert task.state == TaskState.LOST and task.message == "node gpu-01 was deleted by admin"
    assert not Allocation.objects.exists()

    run_scheduler_cycle()  # the job follows its retry policy: back to Pending, a new attempt
    job.refresh_from_db()
    assert (job.state, job.retries) == (JobState.PENDING, 1)
    run_scheduler_cycle()  # and is placed on the node that is left
    task.refresh_from_db()
    assert (task.state, task.node_id, task.attempt) == (TaskState.ASSIGNED, second.pk, 1)
    assert Allocation.objects.get().device.node_id == second.pk


def test_a_job_without_retries_fails_naming_the_deleted_node(api, owner, staff):
    node = make_node("gpu-01", gpus=2)
    job = make_job(owner, replicas=2, gpu=1)
    place(job, node, devices=1)

    assert api(staff).delete("/api/v1/nodes/gpu-01/").status_code == 204
    job = cycle_until(job, JobState.FAILED)
    assert (job.state, job.reason) == (JobState.FAILED, "TaskLost")
    assert "node gpu-01 was deleted" in job.message
    assert Event.objects.filter(job=job, kind="TaskLost", reason="NodeDeleted").exists()
    deleted = Event.objects.get(kind="NodeDeleted")
    assert deleted.message == "node gpu-01 deleted by admin; 2 tasks lost"


def test_a_terminating_job_on_a_deleted_node_ends(api, owner, staff):
    node = make_node("gpu-01")
    job = make_job(owner)
    place(job, node)
    assert api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 202
    run_scheduler_cycle()
    job.refresh_from_db()
    assert job.state == JobState.TERMINATING  # waiting for the agent to confirm the kill

    api(staff).delete("/api/v1/nodes/gpu-01/")
    job = cycle_until(job, JobState.CANCELLED)
    assert job.state == JobState.CANCELLED
    assert job.requested_action == JobRequest.NONE


def test_only_staff_delete_nodes(api, owner):
    node = make_node("gpu-01")
    job = make_job(owner)
    place(job, node)
    assert api(owner).delete("/api/v1/nodes/gpu-01/").status_code == 403
    assert Node.objects.filter(name="gpu-01").exists()
    assert Task.objects.get(job=job).state == TaskState.RUNNING


@pytest.fixture
def console(staff):
    client = Client()
    client.force_login(staff)
    return client


def test_deleting_a_node_in_the_admin_ends_its_tasks(console, owner):
    node = make_node("gpu-01", gpus=1)
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    response = console.post(f"/admin/scheduler/node/{node.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert Task.objects.get(job=job).state == TaskState.LOST
    assert cycle_until(job, JobState.FAILED).state == JobState.FAILED


def test_deleting_nodes_from_the_admin_list_ends_their_tasks(console, owner):
    jobs = []
    for name in ("gpu-01", "gpu-02"):
        job = make_job(owner, name)
        place(job, make_node(name))
        jobs.append(job)
    response = console.post(
        "/admin/scheduler/node/",
        {"action": "delete_selected", "post": "yes",
         "_selected_action": [str(pk) for pk in Node.objects.values_list("pk", flat=True)]},
    )  # fmt: skip
    assert response.status_code == 302
    assert not Node.objects.exists()
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.LOST}
    assert {cycle_until(j, JobState.FAILED).state for j in jobs} == {JobState.FAILED}


def test_a_node_deleted_some_other_way_still_ends_its_tasks(owner):
    node = make_node("gpu-01", gpus=1)
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    Node.objects.filter(pk=node.pk).delete()  # e.g. from a shell: the task's node becomes null

    job = cycle_until(job, JobState.FAILED)
    assert (job.state, job.reason) == (JobState.FAILED, "TaskLost")
    assert "its node was removed" in job.message
