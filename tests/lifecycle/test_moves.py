"""The movers (scheduler/lifecycle/moves.py) write what the tables say: for jobs, every
(event, state) pair the table allows, moved once row by row and once set-based, leaves the
same row, the same event and the same count of finished jobs; for every kind, a single-row
move writes its state and its effects."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler.lifecycle.moves import move_job, move_jobs, move_row, move_rows
from scheduler.models import Event, FinishedJobCount, Job, Task
from scheduler.states.flow import FLOW, STEP
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.machine import IllegalTransition, Machine
from scheduler.states.names import JobState
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent
from tests.factories import make_job, seed

pytestmark = pytest.mark.django_db

PAIRS = [(event, state) for event, moves in MACHINE.table.items() for state in moves]
FIELDS = ("state", "reason", "message", "pending_code", "pending_message", "estimated_start_at",
          "pending_node_reasons", "hold_reason", "terminal_state", "started_at",
          "finished_at")  # fmt: skip


ESTIMATE = timezone.now() + timedelta(hours=2)


def _dirty_job(owner: Any, name: str, state: str, started: Any) -> Job:
    """A job in `state` with every field a move may clear or stamp still set (or empty)."""
    job = make_job(owner, name=name)
    seed(Job.objects.filter(pk=job.pk), state=state, pending_code="Priority",
         pending_message="a job before it waits", estimated_start_at=ESTIMATE,
         pending_node_reasons={"insufficient gpu": 2}, hold_reason="array limit: 2/2 active",
         terminal_state=JobState.FAILED if state == JobState.TERMINATING else "",
         started_at=started)  # fmt: skip
    return Job.objects.get(pk=job.pk)


def _row(job: Job) -> tuple[Any, ...]:
    job.refresh_from_db()
    return tuple(getattr(job, f) for f in FIELDS)


def _finished() -> dict[tuple[str, str], int]:
    return {(c.queue, c.state): c.count for c in FinishedJobCount.objects.all()}


@pytest.mark.parametrize(("event", "state"), PAIRS, ids=[f"{e}-{s}" for e, s in PAIRS])
@pytest.mark.parametrize("started", [False, True], ids=["never-started", "started"])
def test_both_movers_write_what_the_table_says_and_the_same(owner, event, state, started):
    now = timezone.now()
    began = now - timedelta(hours=1) if started else None
    one, many = _dirty_job(owner, "one", state, began), _dirty_job(owner, "many", state, began)
    with transaction.atomic():
        move_job(one, event, "why it moved", now, reason="TaskFailed")
        one.save()
    counted_once = _finished()
    with transaction.atomic():
        move_jobs({many.pk: (state, None)}, event, {many.pk: "why it moved"}, now,
                  reason="TaskFailed")  # fmt: skip
    row_one, row_many = _row(one), _row(many)
    assert row_one == row_many
    new = MACHINE.next_state(state, event)
    effects = MACHINE.effects_of(event)
    assert row_one[:3] == (new, "TaskFailed", "why it moved")
    for name, value in effects.clears.items():
        assert getattr(one, name) == value, name
    for name in effects.stamps:
        assert getattr(one, name) == (began or now), name
    for name in effects.times:
        assert getattr(one, name) == now, name
    recorded = [
        list(Event.objects.filter(job=j).values_list("kind", "reason", "message"))
        for j in (one, many)
    ]
    assert recorded[0] == recorded[1]
    assert bool(recorded[0]) == (new != state or effects.record_stay)
    # A job that ends is counted once by either mover.
    growth = 1 if effects.ends else 0
    assert sum(counted_once.values()) == growth
    assert sum(_finished().values()) == 2 * growth


def test_a_move_the_table_refuses_writes_nothing(owner):
    job = _dirty_job(owner, "done", JobState.SUCCEEDED, None)
    with pytest.raises(IllegalTransition), transaction.atomic():
        move_jobs({job.pk: (JobState.SUCCEEDED, None)}, JobEvent.START, {job.pk: "no"},
                  timezone.now())  # fmt: skip
    assert _row(job)[0] == JobState.SUCCEEDED
    assert not Event.objects.filter(job=job).exists()


def test_an_event_without_a_code_of_its_own_needs_its_writers_reason(owner):
    job = _dirty_job(owner, "j", JobState.RUNNING, None)
    with pytest.raises(IllegalTransition, match="names its reason"):
        move_job(job, JobEvent.FAIL, "no reason given", timezone.now())


KINDS: dict[str, Machine[Any, Any]] = {"task": TASKS, "flow": FLOW, "step": STEP, "job": MACHINE}
ROWS = [(kind, event, state) for kind, machine in KINDS.items()
        for event, moves in machine.table.items() for state in moves]  # fmt: skip


@pytest.mark.parametrize(("kind", "event", "state"), ROWS,
                         ids=[f"{k}-{e}-{s}" for k, e, s in ROWS])  # fmt: skip
def test_move_row_writes_each_kinds_effects(kind, event, state):
    """Every kind's single-row move: the state its table names, the fields its effects clear
    (fresh lists and dicts), the times it stamps where empty and those it sets."""
    machine, now, earlier = KINDS[kind], timezone.now(), timezone.now() - timedelta(hours=1)
    effects = machine.effects_of(event)
    names = {*effects.clears, *effects.stamps, *effects.times}
    row = SimpleNamespace(state=state, **dict.fromkeys(names, "left over"))
    for name in effects.stamps:
        setattr(row, name, earlier)  # already stamped: kept (an empty one: the job test)
    assert move_row(row, machine, event, now) == state
    assert row.state == machine.table[event][state]
    for name, value in effects.clears.items():
        assert getattr(row, name) == value
        if isinstance(value, list | dict):
            assert getattr(row, name) is not value  # never the table's own object
    for name in effects.stamps:
        assert getattr(row, name) == earlier
    for name in effects.times:
        assert getattr(row, name) == now


def test_a_row_without_its_own_value_is_refused_never_filled_with_the_time(owner):
    """Only a stamped time falls back to the move's time; any other per-row field a writer
    forgot for one row is an error before anything is written, not a timestamp in a column."""
    job = make_job(owner, name="j", replicas=2)
    first, second = job.tasks.order_by("pk")
    with pytest.raises(KeyError), transaction.atomic():
        move_rows(Task, TASKS, dict.fromkeys([first.pk, second.pk], "Pending"),
                  TaskEvent.ASSIGN, timezone.now(),
                  per_row={"device_indices": {first.pk: [0]}})  # fmt: skip
    assert set(Task.objects.filter(job=job).values_list("state", flat=True)) == {"Pending"}
