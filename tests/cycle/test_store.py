"""The store adapter and one cycle against the database: snapshot, commit, guards."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.core.cycle import run_cycle
from scheduler.core.model import SchedulingPolicy
from scheduler.cycle import store
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Allocation, Event, Job, Node, Queue, Task
from scheduler.states.names import JobRequest, JobState, NodeState, TaskState
from tests.factories import GI, make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_it_places_a_job_on_a_node_with_its_devices(owner):
    make_node("gpu-1", gpus=4)
    job = make_job(owner, gpu=2)

    report = run_scheduler_cycle()
    task = Task.objects.get(job=job)
    assert task.state == TaskState.ASSIGNED
    assert task.node_id == Node.objects.get(name="gpu-1").pk
    assert sorted(Allocation.objects.filter(task=task).values_list("device__index", flat=True)) == [
        0,
        1,
    ]
    assert report.counts["placed"] == 1
    assert Event.objects.filter(job=job, kind="Scheduled").exists()


def test_it_loads_the_snapshot_in_a_fixed_number_of_queries(owner):
    make_node("a", gpus=2)
    make_node("b", gpus=2)
    for i in range(30):
        make_job(owner, f"j{i}", replicas=2)
    with CaptureQueriesContext(connection) as few:
        store.load_snapshot()
    for i in range(30, 90):
        make_job(owner, f"j{i}", replicas=2)
    with CaptureQueriesContext(connection) as many:
        loaded = store.load_snapshot()
    assert len(many) == len(few) <= 8
    assert len(loaded.snapshot.jobs) == 90


def test_it_records_why_a_job_waits(owner):
    make_node("cpu-only")
    job = make_job(owner, gpu=1)
    run_scheduler_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert (job.pending_code, job.pending_message) == (
        "NeverFits",
        "0/1 nodes fit: 1 insufficient gpu",
    )
    assert job.pending_node_reasons == {"insufficient gpu": 1}


def test_it_places_the_jobs_after_one_with_an_impossible_selector(owner):
    make_node("plain", gpus=2)
    bad = make_job(owner, "bad", node_selector={"gpu-model": "h100"}, priority=10)
    good = [make_job(owner, f"good-{i}", gpu=1) for i in range(2)]
    run_scheduler_cycle()
    assert Task.objects.filter(job__in=good, state=TaskState.ASSIGNED).count() == 2
    bad.refresh_from_db()
    assert bad.pending_code == "NeverFits"
    assert "node selector mismatch" in bad.pending_message


def test_a_stale_decision_fails_alone(owner):
    make_node("gpu-1", gpus=2)
    cancelled = make_job(owner, "cancelled", gpu=1)
    fine = make_job(owner, "fine", gpu=1)
    loaded = store.load_snapshot()
    result = run_cycle(loaded.snapshot, SchedulingPolicy())
    assert len(result.binds) == 2
    # Between snapshot and commit, the user cancels one job.
    Job.objects.filter(pk=cancelled.pk).update(requested_action=JobRequest.CANCEL)

    applied = store.apply_decisions(loaded, result)
    assert applied.stale == 1
    assert applied.placed_jobs == 1
    assert Task.objects.get(job=fine).state == TaskState.ASSIGNED
    assert Task.objects.get(job=cancelled).state == TaskState.PENDING
    assert not Allocation.objects.filter(task__job=cancelled).exists()


def test_it_never_double_books_a_device_taken_since_the_snapshot(owner):
    node = make_node("gpu-1", gpus=1)
    first = make_job(owner, "first", gpu=1)
    loaded = store.load_snapshot()
    result = run_cycle(loaded.snapshot, SchedulingPolicy())
    # Another scheduler placed a job on the device meanwhile.
    other = make_job(owner, "other", gpu=1)
    place(other, node, devices=1)

    applied = store.apply_decisions(loaded, result)
    assert applied.stale == 1
    assert Allocation.objects.get().task.job_id == other.pk
    assert Task.objects.get(job=first).state == TaskState.PENDING


def test_it_does_not_place_on_a_node_cordoned_since_the_snapshot(owner):
    make_node("n1")
    job = make_job(owner)
    loaded = store.load_snapshot()
    result = run_cycle(loaded.snapshot, SchedulingPolicy())
    Node.objects.update(state=NodeState.CORDONED, admin_state=NodeState.CORDONED)
    assert store.apply_decisions(loaded, result).stale == 1
    assert Task.objects.get(job=job).state == TaskState.PENDING


def test_it_preempts_a_lower_priority_job_and_suspends_it(owner):
    node = make_node("gpu-1", gpus=1)
    low = make_job(owner, "low", gpu=1, priority=1)
    place(low, node, devices=1)
    high = make_job(owner, "high", gpu=1, priority=50)

    report = run_scheduler_cycle()
    low.refresh_from_db()
    high.refresh_from_db()
    assert report.counts["preempted"] == 1
    assert (low.state, low.reason) == (JobState.SUSPENDED, "Preempted")
    assert low.tasks.get().kill_requested
    assert Allocation.objects.get().task.job_id == low.pk  # held until the agent confirms
    assert high.pending_code == "Preempting"
    assert "waiting for preempted jobs" in high.pending_message

    # A second cycle while the victim still stops evicts nothing more.
    assert run_scheduler_cycle().counts["preempted"] == 0


def test_it_respects_queue_capability(owner):
    Queue.objects.create(name="small", capability={"gpu": 1})
    make_node("gpu-1", gpus=4)
    first = make_job(owner, "first", gpu=1, queue="small")
    second = make_job(owner, "second", gpu=1, queue="small")
    run_scheduler_cycle()
    assert Task.objects.get(job=first).state == TaskState.ASSIGNED
    second.refresh_from_db()
    assert (second.pending_code, second.pending_message) == (
        "QueueQuota",
        'queue "small" at capability (gpu 1/1)',
    )


def test_it_leaves_held_and_user_suspended_jobs_alone(owner):
    make_node("n1")
    held = make_job(owner, "held", hold_reason="waiting for a parallelism slot")
    suspended = make_job(owner, "suspended", state=JobState.SUSPENDED, reason="UserSuspended")
    run_scheduler_cycle()
    assert Task.objects.get(job=held).state == TaskState.PENDING
    assert Task.objects.get(job=suspended).state == TaskState.PENDING


def test_a_queue_with_a_misshapen_capability_harms_only_itself(owner):
    # Saved past validation (as an admin form once allowed): memory is not a byte count.
    Queue.objects.create(name="broken", capability={"memory": "16Gi"})
    make_node("gpu-1", gpus=2)
    stuck = make_job(owner, "stuck", gpu=1, queue="broken")
    fine = make_job(owner, "fine", gpu=1)

    report = run_scheduler_cycle()
    run_scheduler_cycle()
    assert report.errors == []
    assert Task.objects.get(job=fine).state == TaskState.ASSIGNED
    assert Task.objects.get(job=stuck).state == TaskState.PENDING
    stuck.refresh_from_db()
    assert stuck.pending_code == "SchedulerError"
    assert stuck.pending_message == (
        'queue "broken" is misconfigured: capability memory must be a whole number >= 0'
        " or null, got '16Gi'"
    )
    # Said once, not once per cycle.
    assert Event.objects.filter(kind="QueueInvalid").count() == 1


def test_a_job_with_a_broken_spec_harms_only_itself(owner):
    make_node("gpu-1", gpus=2)
    broken = make_job(owner, "broken", gpu=1, priority=10)
    Job.objects.filter(pk=broken.pk).update(spec={"tasks": "not a list"})
    listed = make_job(owner, "listed", gpu=1, priority=10)
    Job.objects.filter(pk=listed.pk).update(spec=["not", "a", "spec"])
    fine = make_job(owner, "fine", gpu=1)

    report = run_scheduler_cycle()
    run_scheduler_cycle()
    assert report.errors == []
    assert Task.objects.get(job=fine).state == TaskState.ASSIGNED
    for job in (broken, listed):
        job.refresh_from_db()
        assert Task.objects.get(job=job).state == TaskState.PENDING
        assert job.pending_code == "SchedulerError"
        assert job.pending_message.startswith("cannot be scheduled: its stored spec is invalid")
        assert Event.objects.filter(job=job, kind="JobInvalid").count() == 1


def test_a_node_with_broken_labels_takes_no_task_and_harms_no_other(owner):
    bad = make_node("bad", gpus=8)
    Node.objects.filter(pk=bad.pk).update(labels=["not", "labels"])
    good = make_node("good", gpus=1)
    job = make_job(owner, gpu=1)

    report = run_scheduler_cycle()
    run_scheduler_cycle()
    assert report.errors == []
    assert Task.objects.get(job=job).node_id == good.pk
    assert Event.objects.filter(node=bad, kind="NodeInvalid").count() == 1


def test_a_device_taken_since_the_snapshot_drops_only_its_job(owner):
    node = make_node("gpu-1", gpus=2)
    first = make_job(owner, "first", gpu=1)
    second = make_job(owner, "second", gpu=1)
    loaded = store.load_snapshot()
    result = run_cycle(loaded.snapshot, SchedulingPolicy())
    taken = next(b for b in result.binds if b.job_id == first.pk)
    # Another scheduler placed a job on exactly that device meanwhile.
    other = make_job(owner, "other", gpu=1)
    other_task = other.tasks.get()
    Task.objects.filter(pk=other_task.pk).update(state=TaskState.ASSIGNED, node=node)
    Allocation.objects.create(device=node.devices.get(index=taken.devices[0]), task=other_task)

    applied = store.apply_decisions(loaded, result)
    assert (applied.stale, applied.placed_jobs) == (1, 1)
    assert Task.objects.get(job=second).state == TaskState.ASSIGNED
    undone = Task.objects.get(job=first)
    assert (undone.state, undone.node_id, undone.assigned_at) == (TaskState.PENDING, None, None)
    assert not Allocation.objects.filter(task=undone).exists()
    assert Allocation.objects.count() == 2


def test_it_writes_decisions_in_a_fixed_number_of_queries(owner):
    def commit_queries(jobs: int, prefix: str) -> int:
        make_node(f"{prefix}-node", gpus=jobs, cpu=jobs * 1000, memory=jobs * GI)
        for i in range(jobs):
            make_job(owner, f"{prefix}-{i}", gpu=1)
        return run_scheduler_cycle().phases["commit"].queries

    assert commit_queries(3, "few") == commit_queries(40, "many")
