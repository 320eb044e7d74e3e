"""Plugins register behaviour through hooks; the session combines them for the actions.

A hook that has nothing to say returns the neutral value (an empty key, None, True, the
victims unchanged). `default_plugins` is what a cycle runs with; tests and deployments add
their own through `SchedulingPolicy.extra_plugins`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scheduler.core.model import JobInfo, SchedulingPolicy, TaskInfo
from scheduler.core.resources import DIMENSIONS
from scheduler.core.session import Plugin, Session
from scheduler.core.status import Code, Status
from scheduler.core.types import LabelGroup, NodeView, QueueState

__all__ = ["Plugin", "default_plugins"]


class PriorityPlugin(Plugin):
    """Jobs by priority (highest first), then age (oldest first)."""

    name = "priority"

    def job_key(self, session: Session, job: JobInfo) -> tuple[Any, ...]:
        return (-job.priority, job.created_at)

    def preemptable(
        self, session: Session, preemptor: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return [v for v in victims if v.priority < preemptor.priority]


class PreemptablePlugin(Plugin):
    """Only jobs marked preemptible, not already stopping, may be evicted."""

    name = "preemptable"

    def preemptable(
        self, session: Session, preemptor: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return [v for v in victims if _evictable(session, v) and v.queue == preemptor.queue]

    def reclaimable(
        self, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return [v for v in victims if _evictable(session, v) and v.queue != reclaimer.queue]


def _evictable(session: Session, job: JobInfo) -> bool:
    return (
        job.preemptible
        and job.id not in session.evicted
        and job.id not in session.placed  # tasks bound this cycle: evicting them would race
        and not job.suspend_requested
        and any(t.state in ("Assigned", "Running") for t in job.tasks)
    )


class DRFPlugin(Plugin):
    """Queues by weighted dominant resource share, lowest first; reclaim only from queues
    above their weighted fair share, for a queue below its own."""

    name = "drf"

    def queue_key(self, session: Session, queue: QueueState) -> tuple[Any, ...]:
        return (-queue.info.priority, session.share(queue.allocated) / max(queue.info.weight, 1e-9))

    def deserved(self, session: Session, queue_name: str) -> float:
        active = [
            q
            for q in session.queues.values()
            if q.jobs or not q.allocated.is_zero() or q.info.name == queue_name
        ]
        weights = sum(q.info.weight for q in active) or 1.0
        return session.queues[queue_name].info.weight / weights

    def reclaimable(
        self, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        mine = session.queues.get(reclaimer.queue)
        if mine is None or session.share(mine.allocated) >= self.deserved(session, reclaimer.queue):
            return []
        keep = []
        for victim in victims:
            queue = session.queues.get(victim.queue)
            if queue is None or not queue.info.reclaimable:
                continue
            if session.share(queue.allocated) > self.deserved(session, victim.queue):
                keep.append(victim)
        return keep


class CapabilityPlugin(Plugin):
    """A queue's running jobs never hold more than its capability; closed queues admit
    nothing."""

    name = "capability"

    def job_valid(self, session: Session, job: JobInfo) -> Status | None:
        queue = session.queues.get(job.queue)
        if queue is None:
            return Status(Code.QUEUE_MISSING, f'queue "{job.queue}" does not exist')
        if not queue.info.open:
            return Status(Code.QUEUE_CLOSED, f'queue "{job.queue}" is closed')
        cap = queue.info.capability
        if cap is not None:
            need = session.min_request(job)
            for dim in DIMENSIONS:
                if getattr(cap, dim) is not None and getattr(need, dim) > getattr(cap, dim):
                    return Status(
                        Code.NEVER_FITS,
                        f'needs {dim} {need.describe(dim)}, more than queue "{job.queue}"'
                        f" may ever hold ({cap.describe(dim)})",
                    )
        return None

    def overused(self, session: Session, queue: QueueState, job: JobInfo) -> Status | None:
        cap = queue.info.capability
        if cap is None:
            return None
        need = session.min_request(job)
        for dim in DIMENSIONS:
            limit = getattr(cap, dim)
            used = getattr(queue.allocated, dim)
            if getattr(need, dim) and used + getattr(need, dim) > limit:
                return Status(
                    Code.QUEUE_QUOTA,
                    f'queue "{queue.info.name}" at capability'
                    f" ({dim} {queue.allocated.describe(dim)}/{cap.describe(dim)})",
                )
        return None


class GangPlugin(Plugin):
    """A job starts only when `min_available` of its tasks can be placed at once."""

    name = "gang"

    def job_ready(self, session: Session, job: JobInfo, placed: int) -> bool:
        return placed >= session.needed(job)


class PredicatesPlugin(Plugin):
    """Node Ready and node selector; resources are checked by the session's index."""

    name = "predicates"
    implied_by_index = True

    def predicate(
        self, session: Session, job: JobInfo, task: TaskInfo, node: NodeView
    ) -> str | None:
        if not node.ready:
            return "node not ready"
        for key, value in task.node_selector.items():
            if node.labels.get(key) != value:
                return "node selector mismatch"
        return None


class BinpackPlugin(Plugin):
    """Fill the nodes with the fewest free devices first: partly used nodes fill up, whole
    free nodes stay free for large jobs, and a job's tasks land on as few nodes as possible."""

    name = "binpack"
    static_node_order = True

    def node_order(
        self, session: Session, task: TaskInfo, groups: list[LabelGroup]
    ) -> Iterator[NodeView]:
        for free in range(task.resources.gpu, session.max_devices + 1):
            for group in groups:
                bucket = group.buckets.get(free)
                if bucket:
                    yield from list(bucket.values())


class SpreadPlugin(Plugin):
    """The least used node first: jobs spread out across the cluster."""

    name = "spread"

    def node_order(
        self, session: Session, task: TaskInfo, groups: list[LabelGroup]
    ) -> Iterator[NodeView]:
        nodes = [n for g in groups for b in g.buckets.values() for n in b.values()]
        nodes.sort(
            key=lambda n: (
                -len(n.free_devices),
                -(n.free_cpu / n.allocatable.cpu if n.allocatable.cpu else 0),
                n.name,
            )
        )
        return iter(nodes)


def default_plugins(config: SchedulingPolicy) -> list[Plugin]:
    plugins: list[Plugin] = [
        PriorityPlugin(),
        PreemptablePlugin(),
        CapabilityPlugin(),
        GangPlugin(),
        PredicatesPlugin(),
        BinpackPlugin() if config.node_order == "binpack" else SpreadPlugin(),
    ]
    if config.fair_share:
        plugins.insert(1, DRFPlugin())
    plugins += list(config.extra_plugins)
    return [p for p in plugins if p.name not in config.disabled_plugins]
