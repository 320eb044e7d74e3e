"""What users ask of jobs, flows and nodes: recorded now, carried out by the scheduler loop.

Each function checks that the request makes sense in the object's current state and raises
OperationError (HTTP 409) with the reason when it does not.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from scheduler import lifecycle, notify
from scheduler.jobs import arrays
from scheduler.jobs.events import record
from scheduler.jobs.submit import submit_job
from scheduler.lifecycle.moves import move_node
from scheduler.models import Flow, Job, Node
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import FLOW_FINAL, JOB_FINAL, JobRequest, JobState, NodeState
from scheduler.states.node import NodeEvent


class OperationError(Exception):
    """The request does not fit the object's state."""


def request_job_action(job: Job, action: str, user: Any) -> Job:
    if action not in (JobRequest.CANCEL, JobRequest.SUSPEND, JobRequest.RESUME):
        raise OperationError(f"unknown action {action!r}")
    if job.is_array:
        return _request_array_action(job, action, user)
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        if job.state in JOB_FINAL:
            raise OperationError(f"job {job.pk} is {job.state}: nothing to {action}")
        if action == JobRequest.SUSPEND and job.state == JobState.SUSPENDED:
            raise OperationError(f"job {job.pk} is already Suspended")
        if action == JobRequest.RESUME and not (
            job.state == JobState.SUSPENDED or job.requested_action == JobRequest.SUSPEND
        ):
            raise OperationError(f"job {job.pk} is {job.state}, not Suspended: nothing to resume")
        if action == JobRequest.RESUME and job.requested_action == JobRequest.SUSPEND:
            job.requested_action = JobRequest.NONE  # withdraw a suspension not yet carried out
        elif job.requested_action == JobRequest.CANCEL and action != JobRequest.CANCEL:
            raise OperationError(f"job {job.pk} is being cancelled")
        else:
            job.requested_action = action
        job.requested_at = timezone.now()
        job.save(update_fields=["requested_action", "requested_at"])
        who = getattr(user, "username", "") or "system"
        record(
            EventKind(f"Job{action.capitalize()}Requested"),
            Reason.USER_REQUEST,
            f"by {who}",
            job=job,
        )
        notify.changed(jobs=[job.pk])
    return job


def _request_array_action(parent: Job, action: str, user: Any) -> Job:
    """An array parent: cancel reaches every element; suspend and resume are per element."""
    if action != JobRequest.CANCEL:
        raise OperationError(
            f"job {parent.pk} is an array: {action} its elements one by one"
            f" (GET /api/v1/jobs/?array={parent.pk})"
        )
    if not arrays.request_cancel(parent, user):
        raise OperationError(f"array {parent.pk} is {parent.state}: nothing to cancel")
    return parent


def request_flow_cancel(flow: Flow, user: Any) -> Flow:
    with transaction.atomic():
        flow = Flow.objects.select_for_update().get(pk=flow.pk)
        if flow.state in FLOW_FINAL:
            raise OperationError(f"flow {flow.pk} is {flow.state}: nothing to cancel")
        flow.cancel_requested = True
        flow.save(update_fields=["cancel_requested"])
        record(
            EventKind.FLOW_CANCEL_REQUESTED, Reason.USER_REQUEST, f"by {user.username}", flow=flow
        )
        notify.changed(flows=[flow.pk])
    return flow


def _set_admin_state(node: Node, event: NodeEvent, kind: EventKind, user: Any) -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        move_node(node, alive=node.state != NodeState.NOT_READY, admin=event)
        node.save(update_fields=["admin_state", "state"])
        record(kind, Reason.OPERATOR, f"by {getattr(user, 'username', 'system')}", node=node)
        notify.changed(nodes=[node.pk])
    return node


def cordon_node(node: Node, user: Any) -> Node:
    """No new task lands on the node; running ones go on."""
    return _set_admin_state(node, NodeEvent.CORDON, EventKind.NODE_CORDONED, user)


def uncordon_node(node: Node, user: Any) -> Node:
    return _set_admin_state(node, NodeEvent.UNCORDON, EventKind.NODE_UNCORDONED, user)


def drain_node(node: Node, user: Any) -> Node:
    """No new task; running jobs finish; then the node is Drained."""
    return _set_admin_state(node, NodeEvent.DRAIN, EventKind.NODE_DRAINING, user)


def delete_node(node: Node, user: Any) -> int:
    """Forget a node: its tasks end Lost and its devices are freed at once, and each of their
    jobs then follows its retry policy (runs again elsewhere, or Failed). Returns how many
    tasks were lost. The node's agent, if still alive, is refused from now on (its token is
    gone) and may register again as a new node."""
    who = getattr(user, "username", "") or "system"
    name, node_id = node.name, node.pk
    with transaction.atomic():
        # The node's task rows are locked before the node row, in the order a heartbeat
        # locks them, so a heartbeat arriving meanwhile waits instead of deadlocking.
        lost = lifecycle.lose_tasks_of_node(node, f"node {name} was deleted by {who}")
        if Node.objects.select_for_update().filter(pk=node_id).first() is None:
            return len(lost)  # deleted meanwhile by someone else
        record(
            EventKind.NODE_DELETED,
            Reason.OPERATOR,
            f"node {name} deleted by {who}; {len(lost)} tasks lost",
        )
        Node.objects.filter(pk=node_id).delete()
        notify.changed(nodes=[node_id])
    return len(lost)


def reset_node_token(node: Node, user: Any) -> Node:
    """Forget the node's token: its agent (or a replacement machine) must register again with
    the join token, which may then take the name. For a reinstalled machine that lost its
    state, or to shut out an agent whose token leaked."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        node.token_hash = None
        node.save(update_fields=["token_hash"])
        who = getattr(user, "username", "system")
        record(EventKind.NODE_TOKEN_RESET, Reason.OPERATOR, f"by {who}", node=node)
        notify.changed(nodes=[node.pk])
    return node


def resubmit_job(job: Job, user: Any) -> Job:
    """A new job from the old one's spec, owned by the same user; the priority policy is that
    of `user`, who asks for it (SpecError if the spec is no longer accepted)."""
    with transaction.atomic():  # the copy and its event together: never a copy without it
        copy = submit_job(job.owner, job.spec, requested_by=user)
        message = f"by {user.username}: a copy of job {job.pk}"
        record(EventKind.JOB_RESUBMITTED, Reason.USER_REQUEST, message, job=copy)
    return copy
