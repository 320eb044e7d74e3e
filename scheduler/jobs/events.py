"""The audit trail: every state change is written as an Event with a reason."""

from __future__ import annotations

from scheduler.models import Event, Flow, Job, Node


def record(
    kind: str,
    reason: str = "",
    message: str = "",
    *,
    job: Job | None = None,
    flow: Flow | None = None,
    node: Node | None = None,
) -> Event:
    """Write one event; a flow job's events also belong to its flow."""
    flow_id = flow.pk if flow is not None else (job.flow_id if job is not None else None)
    return Event.objects.create(
        kind=kind, reason=reason, message=message, job=job, flow_id=flow_id, node=node
    )
