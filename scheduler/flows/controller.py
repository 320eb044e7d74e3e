"""The flow controller: run in every scheduler cycle, it moves each active flow forward.

Everything is read through the flow's own foreign keys (flow.steps, flow.jobs), never by name,
template or label, so two flows made from the same templates never see each other's jobs and
one's finished jobs can never end the other early (Volcano JobFlow's bug).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from scheduler import notify
from scheduler.flows.graph import ACTIVE, FlowDecision, StepJob, StepView, decide
from scheduler.intake.specs import SpecError, step_job_spec
from scheduler.jobs.events import record
from scheduler.jobs.submit import submit_job
from scheduler.lifecycle import terminate_job
from scheduler.lifecycle.moves import move_row
from scheduler.models import Flow, FlowStep, Job
from scheduler.states.codes import EventKind, Reason
from scheduler.states.flow import FLOW, STEP, FlowEvent, StepEvent
from scheduler.states.names import FlowState, JobState

log = logging.getLogger("berth.flows")
HELD = "waiting for a parallelism slot"


def reconcile_flows() -> int:
    """One pass over active flows; returns how many changed. A failure in one flow is
    logged and the other flows are still reconciled."""
    changed = 0
    ids = Flow.objects.filter(state__in=(FlowState.PENDING, FlowState.RUNNING)).values_list(
        "id", flat=True
    )
    for flow_id in list(ids):
        try:
            with transaction.atomic():
                if reconcile_flow(flow_id):
                    changed += 1
        except Exception:
            log.exception("reconciling flow %s failed", flow_id)
    return changed


def _job_name(flow: Flow, step: FlowStep, item: int | None) -> str:
    base = f"{flow.name}-{step.name}"
    suffix = f"-{item}" if item is not None else ""
    return (base[: 63 - len(suffix)].rstrip("-_.") + suffix) or f"flow-{flow.pk}"


def reconcile_flow(flow_id: int) -> bool:
    """Move one flow forward: start it, stop its jobs on fail-fast or cancel, create the jobs
    its ready steps need, release held jobs and save step and flow states."""
    flow = Flow.objects.select_for_update().filter(pk=flow_id).first()
    if flow is None or flow.state not in (FlowState.PENDING, FlowState.RUNNING):
        return False
    now = timezone.now()
    steps = list(flow.steps.select_related("template").order_by("position"))
    jobs = list(flow.jobs.only("id", "step_id", "item_index", "state", "hold_reason", "name",
                               "message", "created_at").order_by("id"))  # fmt: skip
    decision = decide(_step_views(steps, jobs), fail_fast=flow.fail_fast,
                    cancel=flow.cancel_requested)  # fmt: skip
    changed = False
    if flow.state == FlowState.PENDING:
        move_row(flow, FLOW, FlowEvent.START, now)
        record(EventKind.FLOW_STATE_CHANGED, Reason.STARTED, "Pending -> Running", flow=flow)
        changed = True
    if decision.stop_all:
        _stop_all(flow, decision, jobs, now)
        changed = True
    failed_step = _create_jobs(flow, steps, decision, now)
    changed |= bool(decision.create)
    changed |= _save_step_states(flow, steps, decision, now, keep=failed_step)
    if flow.state == FlowState.RUNNING:
        changed |= _release_holds(flow)
        changed |= _finish(flow, decision, jobs, now)
    if changed:
        flow.save()
        notify.changed(flows=[flow.pk], jobs=[j.pk for j in jobs])
    return changed


def _step_views(steps: list[FlowStep], jobs: list[Job]) -> list[StepView]:
    """The steps as the planner sees them, each with the jobs of its current attempt (a
    retry leaves out the earlier attempts' jobs that did not succeed)."""
    by_step: dict[int, list[Job]] = defaultdict(list)
    for job in jobs:
        by_step[job.step_id or 0].append(job)
    return [
        StepView(
            name=s.name,
            depends_on=list(s.depends_on),
            fan_out=len(s.items) if s.items else 1,
            jobs=[
                StepJob(j.pk, j.item_index or 0, j.state) for j in by_step[s.pk] if s.is_current(j)
            ],  # fmt: skip
            state=s.state,
        )
        for s in steps
    ]


def _stop_all(flow: Flow, decision: FlowDecision, jobs: list[Job], now: datetime) -> None:
    """Fail-fast or cancel: every active job of the flow is stopped."""
    reason = Reason.FLOW_CANCELLED if flow.cancel_requested else Reason.FLOW_FAIL_FAST
    why = "flow cancelled" if flow.cancel_requested else _failure_text(decision, jobs)
    for job in jobs:
        if job.state in ACTIVE and job.state != JobState.TERMINATING:
            terminate_job(
                Job.objects.select_for_update(no_key=True).get(pk=job.pk),
                final_state=JobState.CANCELLED,
                reason=reason,
                message=f"stopped: {why}",
                now=now,
            )


def _create_jobs(flow: Flow, steps: list[FlowStep], decision: FlowDecision, now: datetime) -> str:
    """Create the jobs the decision asks for, held until `_release_holds` lets them go. A step
    whose spec makes no valid job fails, and the flow with it: its name is returned."""
    step_by_name = {s.name: s for s in steps}
    for step_name, item in decision.create:
        step = step_by_name[step_name]
        item_env = step.items[item] if step.items else None
        try:
            spec = step_job_spec(
                step.job_spec, step.overrides, item_env,
                name=_job_name(flow, step, item if step.items else None),
            )  # fmt: skip
            # The template's priority may exceed what the flow's owner may ask for (a staff
            # template, or a cap lowered since the flow was accepted): it is lowered to the cap.
            submit_job(
                flow.owner, spec, flow=flow, step=step, template=step.template,
                item_index=item if step.items else None, hold_reason=HELD,
                lower_priority_to_cap=True,
            )  # fmt: skip
        except SpecError as exc:
            # The spec and overrides make no valid job: the step fails as a job would.
            move_row(step, STEP, StepEvent.FAIL, now)
            step.message = f"cannot make its job: {exc}"
            step.save(update_fields=["state", "message"])
            record(EventKind.STEP_STATE_CHANGED, Reason.INVALID_JOB_SPEC, step.message, flow=flow)
            move_row(flow, FLOW, FlowEvent.FAIL, now)
            flow.reason, flow.message = Reason.INVALID_JOB_SPEC, f"step {step.name}: {exc}"
            return step.name
    return ""


def _save_step_states(
    flow: Flow, steps: list[FlowStep], decision: FlowDecision, now: datetime, *, keep: str
) -> bool:
    """Save each step's state as planned, but the step named `keep` (failed just now)."""
    changed = False
    for step in steps:
        new = decision.steps[step.name]
        if step.name == keep:
            continue
        if step.state != new:
            old = move_row(step, STEP, STEP.event_into(new), now)
            record(EventKind.STEP_STATE_CHANGED, new, f"step {step.name}: {old} -> {new}",
                   flow=flow)  # fmt: skip
            step.save(update_fields=["state"])
            changed = True
    return changed


def _finish(flow: Flow, decision: FlowDecision, jobs: list[Job], now: datetime) -> bool:
    """Give the flow its final state once the decision has one."""
    if decision.state is None:
        return False
    move_row(flow, FLOW, FLOW.event_into(decision.state), now)
    flow.reason = {FlowState.SUCCEEDED: Reason.COMPLETED, FlowState.FAILED: Reason.STEP_FAILED,
                   FlowState.CANCELLED: Reason.CANCELLED}[FlowState(decision.state)]  # fmt: skip
    flow.message = (
        _failure_text(decision, jobs) if decision.state == FlowState.FAILED
        else "all steps succeeded" if decision.state == FlowState.SUCCEEDED
        else "cancelled by user"
    )  # fmt: skip
    record(EventKind.FLOW_STATE_CHANGED, flow.reason, f"Running -> {flow.state}: {flow.message}",
           flow=flow)  # fmt: skip
    return True


def _failure_text(decision: FlowDecision, jobs: list[Job]) -> str:
    failed = decision.failed
    if failed is None:
        return "a step failed"
    step_name, view = failed
    job = next((j for j in jobs if j.pk == view.id), None)
    name = job.name if job else str(view.id)
    detail = f": {job.message}" if job and job.message else ""
    return f"step {step_name} job {name} (id {view.id}) failed{detail}"


def _release_holds(flow: Flow) -> bool:
    """Let held jobs go while the flow has fewer active jobs than its parallelism."""
    active = Job.objects.filter(flow=flow, state__in=ACTIVE)
    held = list(active.exclude(hold_reason="").order_by("id"))
    if not held:
        return False
    limit = flow.parallelism
    running = active.filter(hold_reason="").count()
    slots = len(held) if limit is None else max(0, limit - running)
    release = [j.pk for j in held[:slots]]
    if release:
        Job.objects.filter(pk__in=release).update(hold_reason="")
    waiting = held[slots:]
    if waiting and limit is not None:
        text = f"waiting for a parallelism slot ({running + len(release)}/{limit} active in flow {flow.name})"  # noqa: E501
        Job.objects.filter(pk__in=[j.pk for j in waiting]).update(hold_reason=text)
    return bool(release)
