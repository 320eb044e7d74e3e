"""The job state machine, requests, deadlines, node health and TTL, unit by unit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler import lifecycle
from scheduler.models import Allocation, Event, Flow, Job, Node, Task
from scheduler.states.names import JobRequest, JobState, NodeState, TaskState
from tests.factories import finish_task, make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_it_marks_a_job_succeeded_when_all_tasks_succeed(owner):
    node = make_node()
    job = make_job(owner, replicas=2)
    place(job, node)
    for task in job.tasks.all():
        finish_task(task, TaskState.SUCCEEDED, 0)

    Job.objects.filter(pk=job.pk).update(state=JobState.PENDING, started_at=None)
    assert lifecycle.sync_jobs() == 1
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.finished_at is not None
    assert job.started_at is not None  # it ran between two cycles: it still has a start
    assert Event.objects.filter(job=job, kind="JobStateChanged", reason="Completed").exists()


def test_it_marks_a_job_running_once_min_available_tasks_run(owner):
    node = make_node()
    job = make_job(owner, replicas=3, min_available=2)
    tasks = list(job.tasks.all())
    for task in tasks[:1]:
        task.state, task.node = TaskState.RUNNING, node
        task.save()
    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.PENDING  # 1 of 2 needed

    tasks[1].state, tasks[1].node = TaskState.RUNNING, node
    tasks[1].save()
    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.started_at is not None


def test_it_restarts_the_whole_job_on_a_task_failure_while_retries_remain(owner):
    node = make_node(gpus=2)
    job = make_job(owner, replicas=2, gpu=1, max_retry=2)
    place(job, node, devices=1)
    failed, other = list(job.tasks.all())
    finish_task(failed, TaskState.FAILED, 3)

    lifecycle.sync_jobs()
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.state == JobState.TERMINATING
    assert job.terminal_state == JobState.PENDING
    assert other.kill_requested
    assert Allocation.objects.filter(task=other).exists()  # held until the agent confirms

    finish_task(other, TaskState.KILLED)
    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.retries == 1
    assert {(t.state, t.attempt, t.node_id) for t in job.tasks.all()} == {
        (TaskState.PENDING, 1, None)
    }


def test_it_fails_the_job_with_the_exit_code_when_retries_are_used_up(owner):
    node = make_node()
    job = make_job(owner, max_retry=1, retries=1)
    place(job, node)
    finish_task(job.tasks.get(), TaskState.FAILED, 3)

    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "exited with code 3" in job.message
    assert "after 1 retries" in job.message


def test_it_cancels_a_running_job_through_terminating(owner):
    node = make_node(gpus=1)
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    Job.objects.filter(pk=job.pk).update(requested_action=JobRequest.CANCEL)

    assert lifecycle.process_requests() == 1
    job.refresh_from_db()
    assert job.state == JobState.TERMINATING
    assert job.requested_action == ""
    task = job.tasks.get()
    assert task.kill_requested

    finish_task(task, TaskState.KILLED)
    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.exists()


def test_it_cancels_a_pending_job_at_once(owner):
    job = make_job(owner)
    Job.objects.filter(pk=job.pk).update(requested_action=JobRequest.CANCEL)
    lifecycle.process_requests()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.tasks.get().state == TaskState.KILLED


def test_it_suspends_and_resumes_on_request(owner):
    node = make_node()
    job = make_job(owner)
    place(job, node)
    Job.objects.filter(pk=job.pk).update(requested_action=JobRequest.SUSPEND)
    lifecycle.process_requests()
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.SUSPENDED, lifecycle.USER_SUSPENDED)
    task = job.tasks.get()
    assert task.kill_requested

    # Resume waits until the agent confirms the old task stopped.
    Job.objects.filter(pk=job.pk).update(requested_action=JobRequest.RESUME)
    lifecycle.process_requests()
    job.refresh_from_db()
    assert job.state == JobState.SUSPENDED
    assert job.requested_action == JobRequest.RESUME

    finish_task(task, TaskState.KILLED)
    lifecycle.sync_jobs()
    lifecycle.process_requests()
    job.refresh_from_db()
    task.refresh_from_db()
    assert job.state == JobState.PENDING
    assert (task.state, task.attempt) == (TaskState.PENDING, 1)


def test_it_kills_a_job_past_its_walltime(owner):
    node = make_node()
    job = make_job(owner, walltime=60)
    place(job, node)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=61))

    assert lifecycle.enforce_deadlines() == 1
    job.refresh_from_db()
    assert (job.state, job.reason, job.terminal_state) == (
        JobState.TERMINATING,
        "WalltimeExceeded",
        JobState.FAILED,
    )
    finish_task(job.tasks.get(), TaskState.KILLED)
    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def test_it_leaves_a_job_within_its_walltime_alone(owner):
    node = make_node()
    job = make_job(owner, walltime=60)
    place(job, node)
    assert lifecycle.enforce_deadlines() == 0


def test_it_fails_a_pending_job_past_its_active_deadline(owner):
    job = make_job(owner, active_deadline_seconds=10)
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=11))
    lifecycle.enforce_deadlines()
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.FAILED, "DeadlineExceeded")


@override_settings(BERTH_HEARTBEAT_TIMEOUT=30)
def test_it_loses_the_tasks_of_a_silent_node_and_retries_the_job(owner):
    node = make_node(gpus=1, last_heartbeat=timezone.now() - timedelta(seconds=31))
    healthy = make_node("node-2")
    job = make_job(owner, gpu=1, max_retry=1)
    place(job, node, devices=1)

    assert lifecycle.check_nodes() == 1
    node.refresh_from_db()
    healthy.refresh_from_db()
    assert node.state == NodeState.NOT_READY
    assert healthy.state == NodeState.READY
    assert job.tasks.get().state == TaskState.LOST
    assert not Allocation.objects.exists()  # a lost node's devices are free

    lifecycle.sync_jobs()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.retries == 1


def test_it_marks_a_draining_node_drained_once_empty(owner):
    node = make_node(admin_state=NodeState.DRAINING, state=NodeState.DRAINING)
    job = make_job(owner)
    place(job, node)
    lifecycle.check_nodes()
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING  # lets the running job finish

    finish_task(job.tasks.get(), TaskState.SUCCEEDED, 0)
    lifecycle.check_nodes()
    node.refresh_from_db()
    assert (node.state, node.admin_state) == (NodeState.DRAINED, NodeState.DRAINED)


def _finished(owner, name, ttl, ago, **fields):
    job = make_job(owner, name, ttl_seconds_after_finished=ttl, **fields)
    Job.objects.filter(pk=job.pk).update(
        state=fields.get("state", JobState.SUCCEEDED),
        finished_at=timezone.now() - timedelta(seconds=ago),
    )
    return job


def test_it_deletes_finished_jobs_after_their_ttl_with_tasks(owner):
    expired = _finished(owner, "expired", ttl=60, ago=61)
    fresh = _finished(owner, "fresh", ttl=60, ago=10)
    assert lifecycle.cleanup_ttl() == 1
    assert not Job.objects.filter(pk=expired.pk).exists()
    assert not Task.objects.filter(job_id=expired.pk).exists()
    assert Job.objects.filter(pk=fresh.pk).exists()


def test_it_never_deletes_suspended_jobs_or_requested_suspensions_by_ttl(owner):
    node = make_node()
    suspended = make_job(owner, "suspended", ttl_seconds_after_finished=1)
    Job.objects.filter(pk=suspended.pk).update(state=JobState.SUSPENDED, reason=lifecycle.PREEMPTED)
    requested = make_job(owner, "requested", ttl_seconds_after_finished=1)
    place(requested, node)
    Job.objects.filter(pk=requested.pk).update(requested_action=JobRequest.SUSPEND)
    # A finished job with a suspension asked for it at the last moment: the request counts.
    raced = _finished(owner, "raced", ttl=1, ago=100)
    Job.objects.filter(pk=raced.pk).update(requested_action=JobRequest.SUSPEND)
    expired = _finished(owner, "expired", ttl=1, ago=100)

    assert lifecycle.cleanup_ttl(now=timezone.now() + timedelta(days=1)) == 1
    assert set(Job.objects.values_list("name", flat=True)) == {"suspended", "requested", "raced"}
    assert not Job.objects.filter(pk=expired.pk).exists()


def test_it_leaves_flow_jobs_to_their_flow_ttl(owner):
    flow = Flow.objects.create(name="f", owner=owner, spec={})
    job = _finished(owner, "step", ttl=1, ago=100, flow=flow)
    assert lifecycle.cleanup_ttl() == 0
    assert Job.objects.filter(pk=job.pk).exists()


def test_it_does_not_revive_a_node_by_cordon_alone(owner):
    node = make_node(admin_state=NodeState.CORDONED, state=NodeState.CORDONED)
    assert node.derive_state(alive=False) == NodeState.NOT_READY
    assert node.derive_state(alive=True) == NodeState.CORDONED
    assert Node.objects.get(pk=node.pk).state == NodeState.CORDONED


# A date so late that adding the largest storable number of seconds passes year 9999.
FAR_FUTURE = datetime(9999, 6, 1, tzinfo=UTC)
HUGE = 2_147_483_647  # the largest value PostgreSQL stores in these integer fields


def test_a_huge_active_deadline_never_stops_the_checks_of_other_jobs(owner):
    late = make_job(owner, "late", active_deadline_seconds=10)
    Job.objects.filter(pk=late.pk).update(created_at=timezone.now() - timedelta(seconds=11))
    # Written past validation: the deadline math of this row overflows a datetime.
    huge = make_job(owner, "huge", active_deadline_seconds=HUGE)
    Job.objects.filter(pk=huge.pk).update(created_at=FAR_FUTURE)

    assert lifecycle.enforce_deadlines() == 1
    late.refresh_from_db()
    huge.refresh_from_db()
    assert (late.state, late.reason) == (JobState.FAILED, "DeadlineExceeded")
    assert huge.state == JobState.PENDING


def test_a_huge_walltime_never_stops_the_checks_of_other_jobs(owner):
    node = make_node()
    over = make_job(owner, "over", walltime=10)
    place(over, node)
    Job.objects.filter(pk=over.pk).update(started_at=timezone.now() - timedelta(seconds=11))
    huge = make_job(owner, "huge", walltime=HUGE)
    place(huge, node)
    Job.objects.filter(pk=huge.pk).update(started_at=FAR_FUTURE)

    assert lifecycle.enforce_deadlines() == 1
    over.refresh_from_db()
    huge.refresh_from_db()
    assert (over.state, over.reason) == (JobState.TERMINATING, "WalltimeExceeded")
    assert huge.state == JobState.RUNNING


def test_a_huge_ttl_never_stops_the_cleanup_of_other_jobs(owner):
    expired = _finished(owner, "expired", ttl=60, ago=61)
    huge = _finished(owner, "huge", ttl=HUGE, ago=0)
    Job.objects.filter(pk=huge.pk).update(finished_at=FAR_FUTURE)

    assert lifecycle.cleanup_ttl() == 1
    assert not Job.objects.filter(pk=expired.pk).exists()
    assert Job.objects.filter(pk=huge.pk).exists()


def test_it_reads_running_jobs_in_a_fixed_number_of_queries_when_nothing_changed(owner):
    node = make_node(cpu=1_000_000)
    for i in range(5):
        place(make_job(owner, f"few-{i}"), node)
    with CaptureQueriesContext(connection) as few:
        assert lifecycle.sync_jobs() == 0
    for i in range(40):
        place(make_job(owner, f"many-{i}"), node)
    with CaptureQueriesContext(connection) as many:
        assert lifecycle.sync_jobs() == 0
    assert len(many) == len(few) <= 2


def test_it_starts_and_finishes_many_jobs_in_a_fixed_number_of_queries(owner):
    node = make_node(cpu=1_000_000)
    jobs = [make_job(owner, f"j{i}") for i in range(30)]
    for job in jobs:
        place(job, node)
    Job.objects.update(state=JobState.PENDING, started_at=None)
    with CaptureQueriesContext(connection) as started:
        assert lifecycle.sync_jobs() == 30
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.RUNNING}
    assert Event.objects.filter(kind="JobStateChanged", reason="Started").count() == 30

    Task.objects.update(state=TaskState.SUCCEEDED, exit_code=0, finished_at=timezone.now())
    with CaptureQueriesContext(connection) as finished:
        assert lifecycle.sync_jobs() == 30
    done = Job.objects.get(pk=jobs[0].pk)
    assert (done.state, done.reason) == (JobState.SUCCEEDED, "Completed")
    assert done.started_at is not None and done.finished_at is not None
    # 30 jobs, a handful of queries each way; finishing also counts the jobs per queue for
    # /metrics (an upsert of one counter row per queue, not per job); each batch of state
    # changes also looks up once who wants to be told of them (scheduler/outbox.py).
    assert len(started) <= 9 and len(finished) <= 13
