"""The two job movers: every change of `Job.state` goes through one of them.

Both ask the job state machine (scheduler/states/job.py) where an event takes a job and what
the move writes besides the state (its reason code, the fields it clears, the times it
stamps, whether the job is done), record the event that says why, and count a job that ends.

- `move_job`: one job in memory, saved by its caller, for the writers that decide job by job
  (a user's request, a failed task, a job whose tasks finished stopping, an array's parent).
- `move_jobs`: many rows in one set-based UPDATE (per chunk), for the moves the cycle makes in
  bulk (placed, started, every task succeeded, preempted, cancelled array elements). Its
  caller has locked the rows, in the states the event may leave, and passes what it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from scheduler.jobs.events import record
from scheduler.models import Event, Job
from scheduler.ops import accounting
from scheduler.sql import update_rows
from scheduler.states.codes import EventKind
from scheduler.states.job import MACHINE, JobEvent
from scheduler.states.machine import Effects, IllegalTransition


def _reason(event: JobEvent, effects: Effects, reason: str) -> str:
    if not (reason or effects.reason):
        raise IllegalTransition(f"a job's {event} names its reason: none was given")
    return reason or effects.reason


def move_job(job: Job, event: JobEvent, message: str, now: datetime, reason: str = "") -> None:
    """Apply `event` to `job` (saved by the caller) with the event's own reason code unless
    `reason` names a more precise one, and record it; IllegalTransition if the table does not
    allow it from the job's state."""
    old = job.state
    state = MACHINE.next_state(old, event)
    effects = MACHINE.effects_of(event)
    job.reason = _reason(event, effects, reason)
    job.state, job.message = state, message
    for name, value in effects.cleared().items():
        setattr(job, name, value)
    for name in effects.stamps:
        if getattr(job, name) is None:
            setattr(job, name, now)
    for name in effects.times:
        setattr(job, name, now)
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
    for state, _ in locked.values():
        MACHINE.next_state(state, event)  # refused before anything is written
    _write(locked, event, effects, code, messages, now, stamps or {}, constants or {})
    if record_each:
        changes = _state_events(locked, event, effects, code, messages, event_reasons or {})
        if events is None:
            Event.objects.bulk_create(changes)
        else:
            events.extend(changes)
    if effects.ends:
        _count_ends(locked, event)


def _write(
    locked: Mapping[int, tuple[str, int | None]],
    event: JobEvent,
    effects: Effects,
    code: str,
    messages: Mapping[int, str],
    now: datetime,
    stamps: Mapping[int, datetime | None],
    constants: Mapping[str, Any],
) -> None:
    stamped = list(effects.stamps)
    rows = {pk: (messages[pk], *[stamps.get(pk, now)] * len(stamped)) for pk in locked}
    update_rows(
        Job,
        rows,
        per_row=["message", *stamped],
        keep=stamped,
        constants={
            "reason": code,
            **effects.cleared(),
            **dict.fromkeys(effects.times, now),
            **constants,
        },
        raw=[MACHINE.case_sql(event)],
    )


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
