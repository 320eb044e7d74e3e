"""The job state machine (scheduler/states/job.py): the table itself, and the real code paths
driven by random sequences of what users, agents and the clock do to a job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import lifecycle
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs import operations
from scheduler.jobs.operations import OperationError
from scheduler.models import Event, Job, Node, Task
from scheduler.states.job import FINAL, INITIAL, MACHINE, IllegalTransition, JobEvent
from scheduler.states.names import TASK_ON_NODE, JobState, TaskState
from tests.factories import finish_task, make_job, make_node

events = st.lists(st.sampled_from(list(JobEvent)), max_size=30)


@given(events)
def test_random_event_sequences_only_make_moves_the_table_allows(sequence):
    state = INITIAL
    for event in sequence:
        try:
            new = MACHINE.next_state(state, event)
        except IllegalTransition:
            assert state not in MACHINE.table[event]
            continue
        assert new in JobState.values
        assert MACHINE.table[event][state] == new and MACHINE.allows(state, new)
        assert state not in FINAL  # nothing leaves a final state
        state = new


def test_every_state_is_reachable_from_submission_and_every_job_can_end():
    assert MACHINE.initial == INITIAL and MACHINE.reachable() == set(JobState)
    for state in set(JobState) - FINAL:  # no trap: a final state is one event away
        assert any(MACHINE.table[e].get(state) in FINAL for e in (JobEvent.CANCEL, JobEvent.FAIL))


def test_an_illegal_transition_is_refused():
    with pytest.raises(IllegalTransition, match="a Succeeded job cannot start"):
        MACHINE.next_state(JobState.SUCCEEDED, JobEvent.START)
    with pytest.raises(IllegalTransition):
        MACHINE.next_state(JobState.TERMINATING, JobEvent.SUSPEND)
    with pytest.raises(IllegalTransition):  # a WHERE clause may not name a state it cannot leave
        MACHINE.sources(JobEvent.RESUME, only=(JobState.RUNNING,))
    with pytest.raises(IllegalTransition):  # BIND keeps some states: no single target
        MACHINE.target(JobEvent.BIND)


@pytest.mark.django_db
def test_the_lifecycle_refuses_to_move_a_finished_job(owner):
    job = make_job(owner)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    job.refresh_from_db()
    with pytest.raises(IllegalTransition):
        lifecycle.terminate_job(job, final_state=JobState.CANCELLED, reason="x", message="x")
    with pytest.raises(IllegalTransition):  # Running is not where a stopped job may go
        lifecycle.terminate_job(job, final_state=JobState.RUNNING, reason="x", message="x")
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert not Event.objects.filter(job=job, kind="JobStateChanged").exists()


# --- the real code paths, driven at random -----------------------------------------------


def _on_node(job: Job) -> list[Task]:
    return list(job.tasks.filter(state__in=TASK_ON_NODE))


def _start(job: Job) -> None:  # the agent started what it was given
    job.tasks.filter(state=TaskState.ASSIGNED).update(
        state=TaskState.RUNNING, started_at=timezone.now()
    )


def _succeed(job: Job) -> None:
    for task in job.tasks.filter(state=TaskState.RUNNING):
        finish_task(task, TaskState.SUCCEEDED, 0)


def _fail(job: Job) -> None:
    for task in _on_node(job)[:1]:
        finish_task(task, TaskState.FAILED, 1)


def _confirm_kills(job: Job) -> None:  # the agent confirms the tasks it was told to stop
    for task in job.tasks.filter(state__in=TASK_ON_NODE, kill_requested=True):
        finish_task(task, TaskState.KILLED)


def _lose_node(job: Job) -> None:
    lifecycle.lose_tasks_of_node(Node.objects.get(), "node lost")


def _expire(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(hours=1))
    Job.objects.filter(pk=job.pk).update(active_deadline_seconds=60)


def _request(action: str):
    def ask(job: Job) -> None:
        try:
            operations.request_job_action(job, action, None)
        except OperationError:
            pass  # refused, as the API would

    return ask


ACTIONS = {
    "cycle": lambda job: run_scheduler_cycle(),
    "start": _start,
    "succeed": _succeed,
    "fail": _fail,
    "confirm": _confirm_kills,
    "lose": _lose_node,
    "expire": _expire,
    "cancel": _request("cancel"),
    "suspend": _request("suspend"),
    "resume": _request("resume"),
}


@pytest.mark.django_db
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(st.sampled_from(sorted(ACTIONS)), min_size=1, max_size=12),
    max_retry=st.integers(0, 1),
)
def test_whatever_happens_to_a_job_every_move_is_in_the_table(owner, steps, max_retry):
    with transaction.atomic():
        make_node("n1")
        job = make_job(owner, replicas=2, max_retry=max_retry)
        for step in steps:
            ACTIONS[step](job)
            lifecycle.process_requests()
            lifecycle.sync_jobs()
            lifecycle.enforce_deadlines()
            job.refresh_from_db()
            assert job.state in JobState.values
        for message in Event.objects.filter(job=job, kind="JobStateChanged").values_list(
            "message", flat=True
        ):
            old, new = message.split(":")[0].split(" -> ")
            assert MACHINE.allows(old, new), message
        transaction.set_rollback(True)
