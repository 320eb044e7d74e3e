"""The flow and step state machines: every allowed move of `Flow.state` and `FlowStep.state`.

A flow is created Pending, starts Running with its first step and ends Succeeded, Failed or
Cancelled; only a Failed flow may be retried, which runs it again from its unfinished steps
(scheduler/flows/rerun.py). A step waits Pending for its dependencies, runs, and ends
Succeeded, Failed, Cancelled or Skipped (a `when` that is false, or a failed dependency); a
retried flow puts its unfinished steps back Pending. Writers: scheduler/flows/controller.py
and scheduler/flows/rerun.py.
"""

from __future__ import annotations

from enum import StrEnum

from scheduler.states.machine import Effects, Machine
from scheduler.states.names import FlowState, StepState


class FlowEvent(StrEnum):
    START = "start"  # its first step started
    SUCCEED = "succeed"  # every step ended well
    FAIL = "fail"  # a step failed (fail-fast or at the end)
    CANCEL = "cancel"  # a user asked
    RETRY = "retry"  # a user retried a Failed flow


class StepEvent(StrEnum):
    START = "start"  # its dependencies are met: its jobs were created
    SUCCEED = "succeed"
    FAIL = "fail"  # a job of it failed, or its spec could not make a job
    CANCEL = "cancel"  # its flow was cancelled or failed fast
    SKIP = "skip"  # its `when` is false, or a dependency did not succeed
    RETRY = "retry"  # its flow was retried


_FP, _FR = FlowState.PENDING, FlowState.RUNNING
_FOK, _FFAILED, _FCANCELLED = FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED

FLOW: Machine[FlowState, FlowEvent] = Machine(
    kind="flow",
    states=FlowState,
    initial=_FP,
    final=frozenset({_FOK, _FCANCELLED}),  # a Failed flow may be retried
    table={
        FlowEvent.START: {_FP: _FR},
        FlowEvent.SUCCEED: {_FP: _FOK, _FR: _FOK},
        FlowEvent.FAIL: {_FP: _FFAILED, _FR: _FFAILED},
        FlowEvent.CANCEL: {_FP: _FCANCELLED, _FR: _FCANCELLED},
        FlowEvent.RETRY: {_FFAILED: _FR},
    },
    into={
        _FR: FlowEvent.START,
        _FOK: FlowEvent.SUCCEED,
        _FFAILED: FlowEvent.FAIL,
        _FCANCELLED: FlowEvent.CANCEL,
    },  # fmt: skip
    effects={
        FlowEvent.START: Effects(stamps=("started_at",)),
        FlowEvent.SUCCEED: Effects(times=("finished_at",)),
        FlowEvent.FAIL: Effects(times=("finished_at",)),
        FlowEvent.CANCEL: Effects(times=("finished_at",)),
        # A retried flow runs again: nothing of how it ended is left.
        FlowEvent.RETRY: Effects(
            clears={
                "reason": "",
                "message": "",
                "finished_at": None,
                "cancel_requested": False,
            }
        ),  # fmt: skip
    },
)

_SP, _SR = StepState.PENDING, StepState.RUNNING
_SOK, _SFAILED = StepState.SUCCEEDED, StepState.FAILED
_SCANCELLED, _SSKIPPED = StepState.CANCELLED, StepState.SKIPPED

STEP: Machine[StepState, StepEvent] = Machine(
    kind="step",
    states=StepState,
    initial=_SP,
    final=frozenset({_SOK}),  # a retried flow runs every other step again
    table={
        StepEvent.START: {_SP: _SR},
        StepEvent.SUCCEED: {_SP: _SOK, _SR: _SOK},
        StepEvent.FAIL: {_SP: _SFAILED, _SR: _SFAILED},
        StepEvent.CANCEL: {_SP: _SCANCELLED, _SR: _SCANCELLED},
        StepEvent.SKIP: {_SP: _SSKIPPED},
        StepEvent.RETRY: {_SFAILED: _SP, _SCANCELLED: _SP, _SSKIPPED: _SP},
    },
    into={
        _SR: StepEvent.START,
        _SOK: StepEvent.SUCCEED,
        _SFAILED: StepEvent.FAIL,
        _SCANCELLED: StepEvent.CANCEL,
        _SSKIPPED: StepEvent.SKIP,
        _SP: StepEvent.RETRY,
    },  # fmt: skip
    effects={StepEvent.RETRY: Effects(clears={"message": ""})},
)
