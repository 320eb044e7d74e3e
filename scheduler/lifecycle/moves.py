"""The movers: every change of a job's or a task's state goes through one of them.

Each asks its kind's state machine (scheduler/states/) where an event takes a row and what
the move writes besides the state (the fields it clears, the times it stamps; for jobs also
the reason code, whether the job is done):

- `move_row`: one row in memory, saved by its caller (alone, or with others in one
  statement); `move_rows`: many rows in one set-based UPDATE per chunk, whose caller has
  locked them (or guards the UPDATE) in the states the event may leave. Any kind.
- `move_node`: a node's admin state by an operator's event, and its shown state, which
  follows the admin state and the agent's liveness (`Node.derive_state`).
- `move_job` and `move_jobs`: the same for jobs, which also record the JobStateChanged event
  that says why and count a job that ends. Job writers call these: a user's request, a failed
  task, a job whose tasks finished stopping, an array's parent one by one; the cycle's
  placements, starts, successes, evictions and an array's cancelled elements set-based.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db.models import Model

from scheduler.jobs.events import record
from scheduler.models import Event, Job, Node
from scheduler.ops import accounting
from scheduler.sql import update_rows
from scheduler.states.codes import EventKind
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.machine import Effects, IllegalTransition, Machine
from scheduler.states.node import ADMIN, SHOWN, NodeEvent


def move_row(row: Any, machine: Machine[Any, Any], event: Any, now: datetime) -> str:
    """Apply `event` to `row` in memory: its state and what the event's effects write;
    returns the state it was in. IllegalTransition if the table does not allow it."""
    old = row.state
    row.state = machine.next_state(old, event)
    effects = machine.effects_of(event)
    for name, value in effects.cleared().items():
        setattr(row, name, value)
    for name in effects.stamps:
        if getattr(row, name) is None:
            setattr(row, name, now)
    for name in effects.times:
        setattr(row, name, now)
    return str(old)


def move_rows(
    model: type[Model],
    machine: Machine[Any, Any],
    states: Mapping[int, str],
    event: Any,
    now: datetime,
    *,
    per_row: Mapping[str, Mapping[int, Any]] | None = None,
    constants: Mapping[str, Any] | None = None,
    guards: Mapping[str, Any] | None = None,
) -> set[int]:
    """Apply `event` to the rows of `states` (pk -> the state read under the caller's lock,
    or the one `guards` checks in the UPDATE) in one UPDATE per chunk; returns the pks
    written. `per_row` gives fields their value row by row (field -> pk -> value: a stamped
    time there is the value used where the row has none), `constants` more fields the writer
    sets; nothing is written when one row may not move."""
    for state in states.values():
        machine.next_state(state, event)
    effects = machine.effects_of(event)
    given = dict(per_row or {})
    for name in effects.stamps:
        given.setdefault(name, {})
    names = list(given)
    # A stamped time a writer does not give is the move's; any other field is given per row.
    rows = {
        pk: tuple(given[n].get(pk, now) if n in effects.stamps else given[n][pk] for n in names)
        for pk in states
    }
    return update_rows(
        model,
        rows,
        per_row=names,
        keep=[n for n in names if n in effects.stamps],
        constants={**effects.cleared(), **dict.fromkeys(effects.times, now), **(constants or {})},
        guards=guards,
        raw=[machine.case_sql(event)],
    )


def move_node(node: Node, *, alive: bool, admin: NodeEvent | None = None) -> str:
    """The operator's `admin` event (if any) moves the node's admin state; its shown state then
    follows that and whether its agent is `alive`, by a move the table allows (else
    IllegalTransition). The caller saves the node; returns the shown state it was in."""
    if admin is not None:
        node.admin_state = ADMIN.next_state(node.admin_state, admin)
    old, new = node.state, node.derive_state(alive=alive)
    if new != old and not SHOWN.allows(old, new):
        raise IllegalTransition(f"a {old} node cannot become {new}")
    node.state = new
    return str(old)


def _reason(event: JobEvent, effects: Effects, reason: str) -> str:
    if not (reason or effects.reason):
        raise IllegalTransition(f"a job's {event} names its reason: none was given")
    return reason or effects.reason


def move_job(job: Job, event: JobEvent, message: str, now: datetime, reason: str = "") -> None:
    """Apply `event` to `job` (saved by the caller) with the event's own reason code unless
    `reason` names a more precise one, and record it; IllegalTransition if the table does not
    allow it from the job's state."""
    effects = MACHINE.effects_of(event)
    code = _reason(event, effects, reason)
    old = move_row(job, MACHINE, event, now)
    state, job.reason, job.message = job.state, code, message
    if effects.ends and job.array_size is None:  # an array is counted by its elements
        accounting.record_job_end(job, state)
    if state != old or effects.record_stay:
        text = f"{old} -> {state}: {message}".rstrip(": ")
        record(EventKind.JOB_STATE_CHANGED, job.reason, text, job=job)


def move_jobs(
    locked: Mapping[int, tuple[str, int | None]],
    event: JobEvent,
    messages: Mapping[int, str],
    now: datetime,
    *,
    reason: str = "",
    event_reasons: Mapping[int, str] | None = None,
    stamps: Mapping[int, datetime | None] | None = None,
    constants: Mapping[str, Any] | None = None,
    events: list[Event] | None = None,
    record_each: bool = True,
) -> None:
    """Apply `event` to the `locked` jobs (id -> the state and flow id read under the lock)
    in one UPDATE per chunk, each with its own message (`messages`).

    `reason` replaces the event's own code on the jobs; `event_reasons` the code recorded for
    some (a resumed job's Resumed, an eviction's own reason). `stamps` gives the value of the
    event's stamped times where the job has none (default: `now`); `constants` more fields the
    writer sets. One JobStateChanged event per job whose state changes is appended to `events`
    (written by the caller with its others) or written here; without `record_each` the caller
    records them its own way (an array's elements: one event per array)."""
    if not locked:
        return
    effects = MACHINE.effects_of(event)
    code = _reason(event, effects, reason)
    per_row: dict[str, Mapping[int, Any]] = {"message": messages}
    if stamps is not None:
        per_row.update(dict.fromkeys(effects.stamps, stamps))
    move_rows(Job, MACHINE, {pk: state for pk, (state, _) in locked.items()}, event, now,
              per_row=per_row, constants={"reason": code, **(constants or {})})  # fmt: skip
    if record_each:
        changes = _state_events(locked, event, effects, code, messages, event_reasons or {})
        if events is None:
            Event.objects.bulk_create(changes)
        else:
            events.extend(changes)
    if effects.ends:
        _count_ends(locked, event)


def _state_events(
    locked: Mapping[int, tuple[str, int | None]],
    event: JobEvent,
    effects: Effects,
    code: str,
    messages: Mapping[int, str],
    event_reasons: Mapping[int, str],
) -> list[Event]:
    out = []
    for pk, (old, flow_id) in sorted(locked.items()):
        new = MACHINE.next_state(old, event)
        if new != old or effects.record_stay:
            out.append(
                Event(
                    kind=EventKind.JOB_STATE_CHANGED,
                    reason=event_reasons.get(pk, code),
                    job_id=pk,
                    flow_id=flow_id,
                    message=f"{old} -> {new}: {messages[pk]}".rstrip(": ")[:2000],
                )
            )
    return out


def _count_ends(locked: Mapping[int, tuple[str, int | None]], event: JobEvent) -> None:
    ended: dict[str, list[int]] = {}
    for pk, (old, _) in locked.items():
        ended.setdefault(MACHINE.next_state(old, event), []).append(pk)
    for state, ids in ended.items():
        accounting.record_jobs_end(ids, state)
