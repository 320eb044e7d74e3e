"""The job state machine: every allowed move of `Job.state`, with the event that causes it.

This table is the only place that says how a job may move. Code that changes one job goes
through `next_state` (scheduler/lifecycle/transitions.py, scheduler/jobs/arrays.py); set-based SQL
updates take the states they may change from `sources` for their WHERE clause
(scheduler/lifecycle/, scheduler/cycle/store.py, scheduler/jobs/arrays.py). Anything else is refused
with `IllegalTransition`. docs/architecture.md draws the same table.

A job is created Pending (`INITIAL`); Succeeded, Failed and Cancelled are final: no event
leaves them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType

from scheduler.states.names import JOB_FINAL, JobState


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


class IllegalTransition(ValueError):
    """A move the table does not allow: a bug in the caller, never a user error."""


INITIAL = JobState.PENDING
FINAL = frozenset(JOB_FINAL)

_P, _R, _T = JobState.PENDING, JobState.RUNNING, JobState.TERMINATING
_S = JobState.SUSPENDED
_OK, _FAILED, _CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

# event -> {state the job is in: state it moves to}. A Terminating job moves on once the
# agents confirmed its tasks stopped, by the event its `terminal_state` names (EVENT_INTO).
_TABLE: dict[JobEvent, dict[JobState, JobState]] = {
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
}
TRANSITIONS: Mapping[JobEvent, Mapping[JobState, JobState]] = MappingProxyType(
    {event: MappingProxyType(moves) for event, moves in _TABLE.items()}
)

# The event that brings a job into a state, for callers that name where it goes rather than
# why (terminate_job's final_state, a Terminating job's terminal_state, an array parent's
# state derived from its elements).
EVENT_INTO: Mapping[JobState, JobEvent] = MappingProxyType(
    {
        JobState.RUNNING: JobEvent.START,
        JobState.SUCCEEDED: JobEvent.SUCCEED,
        JobState.FAILED: JobEvent.FAIL,
        JobState.CANCELLED: JobEvent.CANCEL,
        JobState.PENDING: JobEvent.RETRY,
    }
)


def next_state(state: str, event: JobEvent) -> JobState:
    """Where `event` takes a job that is in `state`; IllegalTransition if it may not."""
    target = TRANSITIONS[event].get(JobState(state))
    if target is None:
        raise IllegalTransition(f"a {state} job cannot {event}")
    return target


def event_into(target: str) -> JobEvent:
    """The event that brings a job into `target` (see EVENT_INTO)."""
    try:
        return EVENT_INTO[JobState(target)]
    except (KeyError, ValueError):
        raise IllegalTransition(f"no event is named by {target!r}") from None


def sources(event: JobEvent, only: Iterable[str] | None = None) -> tuple[JobState, ...]:
    """The states `event` may move a job from, for a set-based UPDATE's WHERE clause.

    `only` narrows them (e.g. "no task on a node" means Pending or Suspended); naming a
    state the event may not leave is a bug and raises IllegalTransition."""
    allowed = tuple(TRANSITIONS[event])
    if only is None:
        return allowed
    wanted = tuple(JobState(s) for s in only)
    if refused := [s for s in wanted if s not in allowed]:
        raise IllegalTransition(f"{event} cannot move a job from {', '.join(refused)}")
    return wanted


def target(event: JobEvent) -> JobState:
    """The one state `event` leads to, for a set-based UPDATE that writes a constant."""
    targets = set(TRANSITIONS[event].values())
    if len(targets) != 1:
        raise IllegalTransition(f"{event} leads to {sorted(targets)}, not to one state")
    return targets.pop()


def case_sql(event: JobEvent, column: str = "state") -> str:
    """An SQL assignment applying `event` to each row by its own state (states are fixed
    identifiers from JobState, never user input)."""
    moves = [(s, t) for s, t in TRANSITIONS[event].items() if s != t]
    whens = " ".join(f"WHEN {column} = '{s.value}' THEN '{t.value}'" for s, t in moves)
    return f"{column} = CASE {whens} ELSE {column} END"


def allows(old: str, new: str) -> bool:
    """Some event moves a job from `old` to `new`."""
    return any(table.get(JobState(old)) == new for table in TRANSITIONS.values())
