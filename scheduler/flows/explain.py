"""Why each step of a flow waits, in words for the flow page and the API.

A step waits for one of three things: the steps it depends on (named), a parallelism slot in
its flow (the job's hold reason, with the count), or the scheduler (the step job's own pending
reason: resources, quota, ...). Steps that do not wait get no reason.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scheduler.states.names import FlowState

WAITING_TO_BE_SCHEDULED = "waiting to be scheduled"
MAX_SHOWN = 3  # reasons shown per step; the rest are counted


def step_wait_reasons(flow: Any, steps: list[Any], jobs: list[Any]) -> dict[str, str]:
    """Step name -> why it waits ("" when it does not). `steps` are the flow's FlowStep rows;
    `jobs` its jobs with `pk`, `step_id`, `state`, `hold_reason` and `pending_message`."""
    if flow.state not in (FlowState.PENDING, FlowState.RUNNING) or flow.cancel_requested:
        return {s.name: "" for s in steps}
    by_step: dict[int, list[Any]] = {}
    for job in jobs:
        by_step.setdefault(job.step_id or 0, []).append(job)
    states = {s.name: s.state for s in steps}
    out: dict[str, str] = {}
    for step in steps:
        current = [j for j in by_step.get(step.pk, []) if step.is_current(j)]
        if step.state == "Pending" and not current:
            out[step.name] = _dependency_reason(step, states)
        else:
            out[step.name] = _jobs_reason([j for j in current if j.state == "Pending"])
    return out


def _dependency_reason(step: Any, states: dict[str, str]) -> str:
    waiting = [d for d in step.depends_on if states.get(d) != "Succeeded"]
    if not step.depends_on:
        return "its jobs are created in the next scheduler cycle"
    if not waiting:
        return "its dependencies succeeded: its jobs are created in the next scheduler cycle"
    noun = "step" if len(waiting) == 1 else "steps"
    return f"waiting for {noun} {', '.join(waiting)} to succeed"


def job_reason(job: Any) -> str:
    """Why one pending job waits: held by its flow, or what the scheduler last said."""
    if job.hold_reason:
        return str(job.hold_reason)
    return str(job.pending_message) if job.pending_message else WAITING_TO_BE_SCHEDULED


def _jobs_reason(pending: list[Any]) -> str:
    """The pending jobs' reasons, the most common first: `job 12: 2 GPUs free, 4 wanted`, or
    `3 jobs: waiting for a parallelism slot (2/2 active in flow sweep)`."""
    if not pending:
        return ""
    reasons = Counter(job_reason(j) for j in pending)
    first_job: dict[str, int] = {}
    for job in pending:
        first_job.setdefault(job_reason(job), job.pk)
    parts = []
    for reason, count in reasons.most_common(MAX_SHOWN):
        who = f"job {first_job[reason]}" if count == 1 else f"{count} jobs"
        parts.append(f"{who}: {reason}")
    rest = len(reasons) - MAX_SHOWN
    if rest > 0:
        parts.append(f"{rest} other reasons")
    return "; ".join(parts)
