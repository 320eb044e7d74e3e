"""The job state machine: every allowed move of `Job.state`, with the event that causes it and
what that move writes besides the state (its reason code, the fields it clears, the times it
stamps, whether the job is done).

This table (a `Machine`, scheduler/states/machine.py) is the only place that says how a job
may move and what a move implies. Every writer goes through the two movers of
scheduler/lifecycle/moves.py: `move_job` for one row, `move_jobs` for a set-based UPDATE.
Anything else is refused with `IllegalTransition` (and, in the test suite's database, by a
trigger). docs/architecture.md draws the same table.

A job is created Pending (`INITIAL`); Succeeded, Failed and Cancelled are final: no event
leaves them.
"""

from __future__ import annotations

from enum import StrEnum

from scheduler.states.codes import Reason
from scheduler.states.machine import Effects, IllegalTransition, Machine
from scheduler.states.names import JOB_FINAL, JobState

__all__ = ["FINAL", "INITIAL", "MACHINE", "IllegalTransition", "JobEvent"]


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

# What a waiting job's page shows of the scheduler's view: gone once it is placed or ends.
_WAIT: dict[str, object] = {"pending_code": "", "pending_message": "", "estimated_start_at": None}
# A job that ends: nothing about waiting, stopping or holding is left on it.
_ENDED = Effects(
    clears={**_WAIT, "terminal_state": "", "hold_reason": ""}, times=("finished_at",), ends=True
)

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
        # Pending: it ran and ended between two cycles; Terminating: an interactive job whose
        # session's command exited 0 ends Succeeded once its holding task stopped.
        JobEvent.SUCCEED: {_P: _OK, _R: _OK, _T: _OK},
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
    effects={
        JobEvent.BIND: Effects(
            Reason.SCHEDULED, {**_WAIT, "pending_node_reasons": {}}, record_stay=False
        ),
        JobEvent.START: Effects(Reason.STARTED, clears=_WAIT, stamps=("started_at",)),
        # A job that ran and ended between two cycles was never marked started.
        JobEvent.SUCCEED: Effects(
            Reason.COMPLETED, _ENDED.clears, ("started_at",), _ENDED.times, ends=True
        ),
        JobEvent.PREEMPT: Effects(Reason.PREEMPTED),
        JobEvent.SUSPEND: Effects(Reason.USER_SUSPENDED, {**_WAIT, "hold_reason": ""}),
        JobEvent.RESUME: Effects(Reason.RESUMED),
        JobEvent.RETRY: Effects(Reason.RETRYING, {"terminal_state": "", "started_at": None}),
        JobEvent.FAIL: _ENDED,
        JobEvent.CANCEL: Effects(Reason.CANCELLED, _ENDED.clears, (), _ENDED.times, True),
        # STOP and FAIL have no reason of their own: their writers say why (a walltime, a
        # task's failure, a user's cancel still being carried out).
    },
)
