"""Node health: a node silent past the heartbeat timeout becomes NotReady and its tasks Lost,
a draining node with nothing left on it becomes Drained, and a deleted node's tasks end Lost.
A lost task's job then follows its retry policy (scheduler/lifecycle/sync.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet

from scheduler import notify
from scheduler.cycle import leader
from scheduler.jobs.events import record
from scheduler.lifecycle.moves import move_node, move_rows
from scheduler.lifecycle.transitions import now_or, release
from scheduler.models import Node, Task
from scheduler.ops import accounting
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import TASK_ON_NODE, NodeState, TaskState
from scheduler.states.node import SHOWN, NodeEvent
from scheduler.states.task import MACHINE as TASKS
from scheduler.states.task import TaskEvent


def check_nodes(now: datetime | None = None) -> int:
    """Nodes silent past the heartbeat timeout become NotReady and their tasks Lost;
    draining nodes with nothing left on them become Drained.

    A scheduler that has led for less than the timeout (just started, or back after the
    database was out: nobody could record a renewal meanwhile) judges no node yet: the
    agents get a whole timeout to renew first, as Kubernetes' node controller waits after
    a restart. Agents cut off for real stop their own tasks in that time (agent/partition.py)."""
    now = now_or(now)
    timeout = settings.BERTH_HEARTBEAT_TIMEOUT
    cutoff = now - timedelta(seconds=timeout)
    age = leader.lead_age()
    done = 0
    if age is None or age >= timeout:
        silent = Node.objects.exclude(state=NodeState.NOT_READY).filter(
            Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True)
        )
        done = sum(_mark_not_ready(node, now) for node in silent)
    draining = Node.objects.filter(admin_state=NodeState.DRAINING).exclude(
        tasks__state__in=TASK_ON_NODE
    )
    return done + sum(_mark_drained(node) for node in draining)


def _mark_not_ready(node: Node, now: datetime) -> bool:
    with transaction.atomic():
        # Claimed in the UPDATE: a node whose state changed since it was read waits a cycle.
        claimed = move_rows(Node, SHOWN, {node.pk: node.state}, NodeEvent.LOSE, now,
                            guards={"state": node.state})  # fmt: skip
        if not claimed:
            return False
        why = f"node {node.name} not ready"
        lost = _lose(Task.objects.filter(node=node), why, now, reason=Reason.NODE_NOT_READY)
        record(
            EventKind.NODE_NOT_READY,
            Reason.HEARTBEAT_TIMEOUT,
            f"no heartbeat since {node.last_heartbeat}; {len(lost)} tasks lost",
            node=node,
        )
        notify.changed(nodes=[node.pk])
        return True


def _mark_drained(node: Node) -> bool:
    with transaction.atomic():
        draining = Node.objects.select_for_update().filter(admin_state=NodeState.DRAINING)
        locked = draining.filter(pk=node.pk).first()
        if locked is None:
            return False
        move_node(locked, alive=locked.state != NodeState.NOT_READY, admin=NodeEvent.DRAINED)
        locked.save(update_fields=["admin_state", "state"])
        record(EventKind.NODE_DRAINED, Reason.DRAINED, "no task left on the node", node=node)
        notify.changed(nodes=[node.pk])
        return True


def _lose(
    tasks: QuerySet[Task], why: str, now: datetime, reason: str = Reason.NODE_DELETED
) -> list[Task]:
    """End the tasks of `tasks` that are on a node as Lost, free their devices and account
    for what they used (a silent node, a deleted one); `sync_jobs` then sends each job
    through its retry policy."""
    on_node = tasks.filter(state__in=TASK_ON_NODE).select_related("job")
    lost = list(on_node.select_for_update(of=("self",)))
    release(lost)
    move_rows(Task, TASKS, {t.pk: t.state for t in lost}, TaskEvent.LOSE, now,
              constants={"message": why})  # fmt: skip
    accounting.record_task_ends(lost, now, state=TaskState.LOST)
    for job in {t.job_id: t.job for t in lost}.values():
        record(EventKind.TASK_LOST, reason, why, job=job)
    notify.changed(jobs={t.job_id for t in lost})
    return lost


def lose_tasks_of_node(node: Node, why: str, now: datetime | None = None) -> list[Task]:
    """Called inside the transaction that deletes `node` (scheduler.jobs.operations.delete_node),
    so no task stays Running or Terminating on a node that no longer exists."""
    return _lose(Task.objects.filter(node=node), why, now_or(now))


def lose_orphaned_tasks(now: datetime | None = None) -> int:
    """Tasks still Assigned or Running whose node row is gone (deleted some other way, e.g.
    from a shell: the foreign key is set to null) end Lost; returns how many."""
    with transaction.atomic():
        orphans = Task.objects.filter(node__isnull=True)
        return len(_lose(orphans, "its node was removed", now_or(now)))
