"""The task state machine: every allowed move of `Task.state`.

A task is created Pending; the scheduler assigns it (Assigned: bound to a node and devices),
its agent confirms the start (Running), and it ends Succeeded, Failed, Killed or Lost. An
ended task is not final: a retry, a resumed suspension or an eviction puts it back Pending as
a new attempt (`lifecycle.transitions.fresh_attempt`). Writers: the store (assign, evict),
the agent protocol (start, end), lifecycle (kill, lose, retry), arrays (kill).
"""

from __future__ import annotations

from enum import StrEnum

from scheduler.states.machine import Effects, Machine
from scheduler.states.names import TaskState


class TaskEvent(StrEnum):
    ASSIGN = "assign"  # the scheduler bound it to a node (store commit)
    EVICT = "evict"  # its job was preempted or its bind undone before the agent started it
    START = "start"  # the agent confirmed the process started (a lease or a report)
    SUCCEED = "succeed"  # the agent reported exit 0
    FAIL = "fail"  # the agent reported a non-zero exit, or it could not start
    KILL = "kill"  # stopped on request: by the agent, or at once when it was not on a node
    LOSE = "lose"  # its node went silent or was deleted, or its agent forgot it
    RETRY = "retry"  # a new attempt: its job restarts or resumes


_P, _A, _R = TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING
_OK, _FAILED, _KILLED, _LOST = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.KILLED,
    TaskState.LOST,
)
ENDED = frozenset({_OK, _FAILED, _KILLED, _LOST})
_END = Effects(times=("finished_at",))
# Off its node: no node, no devices, no times of the placement it lost, no GPU sharing mode
# (its agent names the mode anew when it starts: TaskReport.gpu_mode).
_OFF: dict[str, object] = {
    "node": None,
    "device_indices": [],
    "assigned_at": None,
    "gpu_mode": "",
}

MACHINE: Machine[TaskState, TaskEvent] = Machine(
    kind="task",
    states=TaskState,
    initial=_P,
    final=frozenset(),  # an ended task runs again as a new attempt (RETRY)
    table={
        TaskEvent.ASSIGN: {_P: _A},
        TaskEvent.EVICT: {_A: _P, _R: _P},
        TaskEvent.START: {_A: _R},
        TaskEvent.SUCCEED: {_A: _OK, _R: _OK},  # Assigned: it ended before the lease confirmed
        TaskEvent.FAIL: {_A: _FAILED, _R: _FAILED},
        TaskEvent.KILL: {_P: _KILLED, _A: _KILLED, _R: _KILLED},
        TaskEvent.LOSE: {_A: _LOST, _R: _LOST},
        TaskEvent.RETRY: {_P: _P, _OK: _P, _FAILED: _P, _KILLED: _P, _LOST: _P},
    },
    into={
        _R: TaskEvent.START,
        _OK: TaskEvent.SUCCEED,
        _FAILED: TaskEvent.FAIL,
        _KILLED: TaskEvent.KILL,
        _LOST: TaskEvent.LOSE,
    },  # fmt: skip
    # When it started is the agent's word, bounded (scheduler/agent/times.py): START's writers
    # give it row by row. A retry's writer also counts the attempt up.
    effects={
        TaskEvent.ASSIGN: Effects(clears={"kill_requested": False}, times=("assigned_at",)),
        TaskEvent.EVICT: Effects(clears=_OFF),
        TaskEvent.SUCCEED: _END,
        TaskEvent.FAIL: _END,
        TaskEvent.KILL: _END,
        TaskEvent.LOSE: _END,
        TaskEvent.RETRY: Effects(
            clears={
                **_OFF,
                "exit_code": None,
                "reason": "",
                "kill_requested": False,
                "started_at": None,
                "finished_at": None,
            }
        ),  # fmt: skip
    },
)
