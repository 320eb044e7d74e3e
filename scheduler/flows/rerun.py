"""Run a flow again: retry a failed flow from its failed steps, or resubmit it as a fresh copy
(jobs are resubmitted by `scheduler.jobs.operations.resubmit_job`).

A retry (like `argo retry`) keeps every step that succeeded, and every job that succeeded in
a fan-out step, with their outputs; the other steps start again from Pending. Their earlier
jobs stay in the flow for the record but no longer count: the step remembers the first job
id of its new attempt (`FlowStep.retried_below`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from scheduler import notify
from scheduler.jobs.events import record
from scheduler.jobs.operations import OperationError
from scheduler.jobs.submit import create_flow
from scheduler.lifecycle.moves import move_row
from scheduler.models import Flow
from scheduler.states.codes import EventKind, Reason
from scheduler.states.flow import FLOW, STEP, FlowEvent, StepEvent
from scheduler.states.names import JOB_ACTIVE, FlowState

FLOW_DONE = (FlowState.SUCCEEDED, FlowState.CANCELLED)  # finished, and not by failing


def retry_flow(flow: Flow, user: Any) -> Flow:
    """Re-run a Failed flow's failed, cancelled and skipped steps; OperationError otherwise."""
    with transaction.atomic():
        flow = Flow.objects.select_for_update().get(pk=flow.pk)
        if flow.state != FlowState.FAILED:
            raise OperationError(
                f"flow {flow.pk} is {flow.state}: only a Failed flow can be retried"
                + (" (resubmit it to run it again)" if flow.state in FLOW_DONE else "")
            )
        if flow.jobs.filter(state__in=JOB_ACTIVE).exists():
            raise OperationError(
                f"flow {flow.pk} still has active jobs: retry it once they have ended"
            )
        # Every job a later attempt makes gets a larger id than any job made so far.
        newest = flow.jobs.aggregate(newest=Max("id"))["newest"] or 0
        again = [s for s in flow.steps.all() if s.state != "Succeeded"]
        now = timezone.now()
        for step in again:
            move_row(step, STEP, StepEvent.RETRY, now)
            step.retried_below = newest + 1
            step.save(update_fields=["state", "message", "retried_below"])
        move_row(flow, FLOW, FlowEvent.RETRY, now)
        flow.save(update_fields=["state", "reason", "message", "finished_at",
                                 "cancel_requested"])  # fmt: skip
        names = ", ".join(s.name for s in again)
        record(EventKind.FLOW_RETRIED, Reason.USER_REQUEST,
               f"by {user.username}: steps {names} run again", flow=flow)  # fmt: skip
        notify.changed(flows=[flow.pk])
    return flow


def resubmit_flow(flow: Flow, user: Any) -> Flow:
    """A fresh copy of `flow` from its spec; every step runs again. As for a resubmitted job
    (`operations.resubmit_job`), the copy is still the flow owner's when staff ask for it, and
    is checked against the owner's priority policy (SpecError when no longer accepted)."""
    with transaction.atomic():  # the copy and its event together
        copy = create_flow(flow.owner, flow.spec)
        record(EventKind.FLOW_RESUBMITTED, Reason.USER_REQUEST,
               f"by {user.username}: a copy of flow {flow.pk}", flow=copy)  # fmt: skip
    return copy
