"""Every kind's state machine (scheduler/states/): the tables' own properties, for each kind,
and the test database's guard that refuses a move no table allows, whoever writes it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from hypothesis import given
from hypothesis import strategies as st

from scheduler import sql
from scheduler.models import Flow, FlowStep, Job, Node, Task
from scheduler.states import flow, job, node, task
from scheduler.states.machine import IllegalTransition, Machine
from scheduler.states.names import FlowState, JobState, NodeState, StepState, TaskState
from tests.factories import make_job, make_node

MACHINES: list[Machine[Any, Any]] = [
    job.MACHINE,
    task.MACHINE,
    flow.FLOW,
    flow.STEP,
    node.SHOWN,
    node.ADMIN,
]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.kind)
def test_every_state_is_reachable_and_no_final_state_is_left(
    machine: Machine[Any, Any],
) -> None:
    assert machine.reachable() == set(machine.states.__members__.values())
    for moves in machine.table.values():
        for old, new in moves.items():
            assert old not in machine.final or new == old
    states = set(machine.states.__members__.values())
    for state in states - machine.final:  # no trap: every state can move on
        assert any(state in moves and moves[state] != state for moves in machine.table.values())


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.kind)
def test_into_names_an_event_that_really_leads_there(machine: Machine[Any, Any]) -> None:
    for state, event in machine.into.items():
        assert state in machine.table[event].values()


@given(st.sampled_from(MACHINES).flatmap(
    lambda m: st.tuples(st.just(m), st.lists(st.sampled_from(list(m.table)), max_size=30))
))  # fmt: skip
def test_random_event_sequences_only_make_moves_the_table_allows(case: tuple) -> None:
    machine, sequence = case
    state = machine.initial
    for event in sequence:
        try:
            new = machine.next_state(state, event)
        except IllegalTransition:
            assert state not in machine.table[event]
            continue
        assert machine.table[event][state] == new
        assert new == state or (state.value, new.value) in machine.allowed_moves()
        assert machine.allows(state, new) or new == state
        state = new


def test_sources_and_target_refuse_what_the_table_does_not_say() -> None:
    assert task.MACHINE.target(task.TaskEvent.KILL) == TaskState.KILLED
    with pytest.raises(IllegalTransition):
        job.MACHINE.target(job.JobEvent.BIND)  # Pending or Running: no one state to write
    with pytest.raises(IllegalTransition):
        task.MACHINE.sources(task.TaskEvent.START, only=[TaskState.PENDING])
    with pytest.raises(IllegalTransition):
        flow.FLOW.next_state(FlowState.SUCCEEDED, flow.FlowEvent.RETRY)
    assert flow.FLOW.next_state(FlowState.FAILED, flow.FlowEvent.RETRY) == FlowState.RUNNING


@pytest.mark.django_db
def test_the_test_database_refuses_a_move_no_table_allows(owner) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the guard is a PostgreSQL trigger")
    the_job = make_job(owner, state=JobState.SUCCEEDED)
    with pytest.raises(DatabaseError, match="illegal job move: Succeeded -> Running"):
        with transaction.atomic():
            Job.objects.filter(pk=the_job.pk).update(state=JobState.RUNNING)
    Job.objects.filter(pk=the_job.pk).update(state=JobState.SUCCEEDED)  # staying put is fine
    a_task = Task.objects.filter(job=the_job).first()
    assert a_task is not None
    with pytest.raises(DatabaseError, match="illegal task move: Pending -> Running"):
        with transaction.atomic():
            Task.objects.filter(pk=a_task.pk).update(state=TaskState.RUNNING)
    Task.objects.filter(pk=a_task.pk).update(state=TaskState.ASSIGNED)  # a legal move


@pytest.mark.django_db
def test_every_state_column_is_guarded(owner) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the guard is a PostgreSQL trigger")
    assert sql.guard_state_moves(connection) == [
        "scheduler_job.state",
        "scheduler_task.state",
        "scheduler_flow.state",
        "scheduler_flowstep.state",
        "scheduler_node.state",
        "scheduler_node.admin_state",
    ]
    a_node = make_node("guarded")
    with pytest.raises(DatabaseError, match="illegal node admin state move"):
        with transaction.atomic():
            Node.objects.filter(pk=a_node.pk).update(admin_state=NodeState.DRAINED)
    a_flow = Flow.objects.create(name="f", owner=owner, spec={}, state=FlowState.SUCCEEDED)
    with pytest.raises(DatabaseError, match="illegal flow move"):
        with transaction.atomic():
            Flow.objects.filter(pk=a_flow.pk).update(state=FlowState.RUNNING)
    step = FlowStep.objects.create(
        flow=a_flow, name="s", position=0, spec={}, state=StepState.SUCCEEDED
    )
    with pytest.raises(DatabaseError, match="illegal step move"):
        with transaction.atomic():
            FlowStep.objects.filter(pk=step.pk).update(state=StepState.PENDING)
