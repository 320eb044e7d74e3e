"""The job state machine: every allowed move of `Job.state`, with the event that causes it.

This table (a `Machine`, scheduler/states/machine.py) is the only place that says how a job
may move. Code that changes one job goes through `next_state`
(scheduler/lifecycle/transitions.py, scheduler/jobs/arrays.py); set-based SQL updates take
the states they may change from `sources` for their WHERE clause (scheduler/lifecycle/,
scheduler/cycle/store.py, scheduler/jobs/arrays.py). Anything else is refused with
`IllegalTransition`. docs/architecture.md draws the same table.

A job is created Pending (`INITIAL`); Succeeded, Failed and Cancelled are final: no event
leaves them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from scheduler.states.machine import IllegalTransition, Machine
from scheduler.states.names import JOB_FINAL, JobState

__all__ = ["FINAL", "INITIAL", "MACHINE", "TRANSITIONS", "IllegalTransition", "JobEvent"]


class JobEvent(StrEnum):
    BIND = "bind"  # the scheduler placed the job's tasks (store commit)
    START = "start"  # min_available tasks started (sync from task states; an array's element)
    SUCCEED = "succeed"  # every task succeeded
    PREEMPT = "preempt"  # evicted for a more important job (store commit)
    SUSPEND = "suspend"  # a user asked (carried out by process_requests)
    RESUME = "resume"  # a user resumed a suspended job
    STOP = "stop"  # asked to end while tasks still run: wait for the agents to confirm
    RETRY = "retry"  # a task failed or was lost and retries remain: start again afresh
    FAIL = "fail"  # a task failed or was lost past its retries, walltime or deadline passed
    CANCEL = "cancel"  # a user, its flow or its array cancelled it


INITIAL = JobState.PENDING
FINAL = frozenset(JOB_FINAL)

_P, _R, _T = JobState.PENDING, JobState.RUNNING, JobState.TERMINATING
_S = JobState.SUSPENDED
_OK, _FAILED, _CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

# event -> {state the job is in: state it moves to}. A Terminating job moves on once the
# agents confirmed its tasks stopped, by the event its `terminal_state` names (`into`).
MACHINE: Machine[JobState, JobEvent] = Machine(
    kind="job",
    states=JobState,
    initial=INITIAL,
    final=FINAL,
    table={
        JobEvent.BIND: {_P: _P, _S: _P, _R: _R},  # a preempted job placed again waits to start
        JobEvent.START: {_P: _R},
        JobEvent.SUCCEED: {_P: _OK, _R: _OK},  # Pending: it ran and ended between two cycles
        JobEvent.PREEMPT: {_P: _S, _R: _S},
        JobEvent.SUSPEND: {_P: _S, _R: _S},
        JobEvent.RESUME: {_S: _P},
        JobEvent.STOP: {_P: _T, _R: _T, _S: _T},
        JobEvent.RETRY: {_P: _P, _R: _P, _T: _P},
        JobEvent.FAIL: {_P: _FAILED, _R: _FAILED, _S: _FAILED, _T: _FAILED},
        JobEvent.CANCEL: {_P: _CANCELLED, _R: _CANCELLED, _S: _CANCELLED, _T: _CANCELLED},
    },
    # The event that brings a job into a state, for callers that name where it goes rather
    # than why (terminate_job's final_state, a Terminating job's terminal_state, an array
    # parent's state derived from its elements).
    into={
        JobState.RUNNING: JobEvent.START,
        JobState.SUCCEEDED: JobEvent.SUCCEED,
        JobState.FAILED: JobEvent.FAIL,
        JobState.CANCELLED: JobEvent.CANCEL,
        JobState.PENDING: JobEvent.RETRY,
    },
)
TRANSITIONS: Mapping[JobEvent, Mapping[JobState, JobState]] = MACHINE.table
EVENT_INTO: Mapping[JobState, JobEvent] = MACHINE.into


def next_state(state: str, event: JobEvent) -> JobState:
    """Where `event` takes a job that is in `state`; IllegalTransition if it may not."""
    return MACHINE.next_state(state, event)


def event_into(target: str) -> JobEvent:
    """The event that brings a job into `target` (see EVENT_INTO)."""
    return MACHINE.event_into(target)


def sources(event: JobEvent, only: Iterable[str] | None = None) -> tuple[JobState, ...]:
    """The states `event` may move a job from, for a set-based UPDATE's WHERE clause.

    `only` narrows them (e.g. "no task on a node" means Pending or Suspended); naming a
    state the event may not leave is a bug and raises IllegalTransition."""
    return MACHINE.sources(event, only)


def target(event: JobEvent) -> JobState:
    """The one state `event` leads to, for a set-based UPDATE that writes a constant."""
    return MACHINE.target(event)


def case_sql(event: JobEvent, column: str = "state") -> str:
    """An SQL assignment applying `event` to each row by its own state."""
    return MACHINE.case_sql(event, column)


def allows(old: str, new: str) -> bool:
    """Some event moves a job from `old` to `new`."""
    return MACHINE.allows(old, new)
