"""Plugins register behaviour through hooks; the session combines them for the actions.

A hook that has nothing to say returns the neutral value (an empty key, None, True, the
victims unchanged). `default_plugins` is what a cycle runs with; tests and deployments add
their own through `SchedulingPolicy.extra_plugins`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from scheduler.core import sharing
from scheduler.core.model import JobInfo, SchedulingPolicy, TaskInfo
from scheduler.core.priority import Factors, fair_share_factors
from scheduler.core.resources import DIMENSIONS, Resources, tuple_new
from scheduler.core.session import Plugin, Session
from scheduler.core.status import Code, Status
from scheduler.core.types import HOLDS_RESOURCES, LabelGroup, NodeView, QueueState

__all__ = ["Plugin", "default_plugins"]

MILLI = sharing.MILLI


class PriorityPlugin(Plugin):
    """Jobs by their multifactor priority (`scheduler.core.priority`; highest first), then
    their own priority, then age (oldest first). With the factors off, by their own priority
    then age alone, as before the factors existed. Preemption still needs a higher own
    priority: fair share orders jobs, it never evicts anyone."""

    name = "priority"

    def open(self, session: Session) -> None:
        self.weights = session.config.priority_weights
        self.fair: dict[str, float] = {}  # owner -> fair-share factor
        self.top_queue = max((q.info.priority for q in session.queues.values()), default=0)
        self._queue_factors: dict[str, float] = {}  # queue -> queue factor, as first asked
        if self.weights.fair_share:
            owners = {job.owner for job in session.candidates}
            self.fair = fair_share_factors(session.usage, session.shares, owners)

    @property
    def numbers_first_nan(self) -> bool:  # type: ignore[override]
        """With weights, a key is (-priority, -own priority, created_at, id): its one float
        besides the priority is created_at, and a NaN created_at makes the priority NaN
        (as a NaN factor would). Without, created_at comes second, NaN or not."""
        return not self.weights.off

    def job_key(self, session: Session, job: JobInfo) -> tuple[Any, ...]:
        return self.keys_with_ids(session, [job])[0][:-1]

    def keys_with_ids(self, session: Session, jobs: list[JobInfo]) -> list[tuple[Any, ...]]:
        """Each job's `job_key` with its id after it (the session's key), worked out in one
        pass over `jobs` (a whole backlog's), each job's factors recorded in
        `session.factors` as it goes. The weights are read once, each owner's and queue's
        factor looked up by itself (no (owner, queue) pair made per job); the arithmetic
        is `combine`'s, in the same order, so the floats are the same."""
        weights = self.weights
        if weights.off:
            return [(-job.priority, job.created_at, job.id) for job in jobs]
        w_age, w_fair, w_size = weights.age, weights.fair_share, weights.job_size
        w_queue, w_priority, max_age = weights.queue, weights.priority, weights.max_age
        now, favor_small = session.now, weights.favor_small
        fair_of, queue_of, recorded = self.fair, self._queue_factors, session.factors
        keys: list[tuple[Any, ...]] = []
        add = keys.append
        for job in jobs:
            fair = 0.0
            if w_fair:
                known = fair_of.get(job.owner)
                if known is None:  # a standing session's newcomer
                    fair_of = self._newcomer(session, job.owner)
                    known = fair_of[job.owner]
                fair = known
            queue = queue_of.get(job.queue)
            if queue is None:
                queue = queue_of[job.queue] = self._queue_factor(session, job.queue)
            waited = now - job.created_at  # `age_factor`, spelled out
            age = (0.0 if 0.0 > waited else waited) / max_age
            if 1.0 < age:
                age = 1.0
            size = min(1.0, session.share(session.min_request(job))) if w_size else 0.0
            if favor_small:
                size = 1.0 - size
            own = job.priority
            total = w_age * age + w_fair * fair + w_size * size + w_queue * queue + w_priority * own
            # `new_factors`, spelled out: once per pending job.
            factors = tuple_new(Factors, (total, age, fair, size, queue, own))
            recorded[job.id] = factors
            add((-total, -own, job.created_at, job.id))
        return keys

    def _newcomer(self, session: Session, owner: str) -> dict[str, float]:
        """The fair-share factors again with `owner` among the owners (a standing session's
        newcomer: every owner's factor moves)."""
        self.fair = fair_share_factors(session.usage, session.shares, set(self.fair) | {owner})
        return self.fair

    def _queue_factor(self, session: Session, name: str) -> float:
        queue = session.queues.get(name)
        queue_priority = queue.info.priority if queue is not None else 0
        return max(0, queue_priority) / self.top_queue if self.top_queue > 0 else 0.0

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
        # (The queue first: it rules out most victims, and costs less to ask.)
        return [v for v in victims if v.queue == preemptor.queue and _evictable(session, v)]

    def reclaimable(
        self, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return [v for v in victims if v.queue != reclaimer.queue and _evictable(session, v)]


def _evictable(session: Session, job: JobInfo) -> bool:
    if (
        not job.preemptible
        or job.id in session.evicted
        or job.id in session.placed  # tasks bound this cycle: evicting them would race
        or job.suspend_requested
    ):
        return False
    for task in job.tasks:  # (`any` over a generator, spelled out: once per victim)
        if task.state == "Running" or task.state == "Assigned":
            return True
    return False


def fair_share(weights: Mapping[str, float], counted: Collection[str], queue: str) -> float:
    """A queue's weighted fair share of the cluster: its weight over the weights of the
    queues that count (those with work waiting or held), itself included whether it counts
    or not. DRFPlugin and the dashboard's queue bars both use this."""
    total = sum(w for name, w in weights.items() if name in counted or name == queue)
    return weights[queue] / total if total else 0.0


class DRFPlugin(Plugin):
    """Queues by weighted dominant resource share, lowest first; reclaim only from queues
    above their weighted fair share, for a queue below its own."""

    name = "drf"

    def queue_key(self, session: Session, queue: QueueState) -> tuple[Any, ...]:
        return (-queue.info.priority, session.queue_share(queue) / max(queue.info.weight, 1e-9))

    def deserved(self, session: Session, queue_name: str) -> float:
        queues = session.queues.values()
        counted = {
            q.info.name for q in queues if q.jobs or not q.allocated.is_zero() or q.shared_gpu
        }
        return fair_share({q.info.name: q.info.weight for q in queues}, counted, queue_name)

    def reclaimable(
        self, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        mine = session.queues.get(reclaimer.queue)
        if mine is None or session.queue_share(mine) >= self.deserved(session, reclaimer.queue):
            return []
        # Whether a queue is above its share is the same for all its victims (nothing
        # changes while they are sorted): asked once per queue, not once per victim.
        above: dict[str, bool] = {}
        keep = []
        for victim in victims:
            over = above.get(victim.queue)
            if over is None:
                over = above[victim.queue] = self.above_share(session, victim.queue)
            if over:
                keep.append(victim)
        return keep

    def above_share(self, session: Session, queue_name: str) -> bool:
        """Whether the queue may be reclaimed from: it exists, is reclaimable, and holds
        more than its weighted fair share."""
        queue = session.queues.get(queue_name)
        if queue is None or not queue.info.reclaimable:
            return False
        return session.queue_share(queue) > self.deserved(session, queue_name)


class CapabilityPlugin(Plugin):
    """A queue's running jobs never hold more than its capability; closed queues admit
    nothing."""

    name = "capability"
    alike_overused = True  # by the job's queue and gang request alone
    valid_in_open_queue = True

    def job_valid(self, session: Session, job: JobInfo) -> Status | None:
        queue = session.queues.get(job.queue)
        if queue is None:
            return Status(Code.QUEUE_MISSING, f'queue "{job.queue}" does not exist')
        if not queue.info.open:
            return Status(Code.QUEUE_CLOSED, f'queue "{job.queue}" is closed')
        cap = queue.info.capability
        if cap is not None:
            need = session.min_request(job)
            milli = session.min_gpu_milli(job)
            for dim in DIMENSIONS:
                limit = getattr(cap, dim)
                if dim == "gpu" and limit is not None and milli > limit * MILLI:
                    return Status(
                        Code.NEVER_FITS,
                        f'needs gpu {_gpus(milli)}, more than queue "{job.queue}"'
                        f" may ever hold ({cap.describe(dim)})",
                    )
                if dim != "gpu" and limit is not None and getattr(need, dim) > limit:
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
            if dim == "gpu":  # in thousandths: fractions and MIG instances as their shares
                used = queue.allocated.gpu * MILLI + queue.shared_gpu
                more = session.min_gpu_milli(job)
                if more and used + more > limit * MILLI:
                    return Status(
                        Code.QUEUE_QUOTA,
                        f'queue "{queue.info.name}" at capability'
                        f" (gpu {_gpus(used)}/{cap.describe(dim)})",
                    )
                continue
            used = getattr(queue.allocated, dim)
            if getattr(need, dim) and used + getattr(need, dim) > limit:
                return Status(
                    Code.QUEUE_QUOTA,
                    f'queue "{queue.info.name}" at capability'
                    f" ({dim} {queue.allocated.describe(dim)}/{cap.describe(dim)})",
                )
        return None


class UserLimitPlugin(Plugin):
    """Per-user running limits per queue (Slurm's MaxTRESPerUser and MaxJobsPerUser): a job
    whose start would take its owner past one waits with `UserLimit`. What each owner runs
    is counted once per cycle from the running jobs, then kept as the cycle binds and
    evicts."""

    name = "userlimit"
    alike_overused = True  # by the queue, owner, gang request and runtime (`_kept_for_reservation`)

    def open(self, session: Session) -> None:
        self._bound: list[Any] | None = None  # the cycle's bind list the counts are for
        self.use: dict[tuple[str, str], list[int]] = {}  # (queue, owner) -> gpu, cpu, jobs
        # job -> what it holds, as counted (gpu in thousandths: `sharing.gpu_milli`)
        self.counted: dict[int, Resources] = {}

    def overused(self, session: Session, queue: QueueState, job: JobInfo) -> Status | None:
        info = queue.info
        if not info.user_limited or job.owner in info.limits_exempt:
            return None
        gpu, cpu, jobs = self._use_of(session, info.name, job.owner)
        need = session.min_request(job)
        more_jobs = 0 if job.id in self.counted else 1
        kept = _kept_for_reservation(session, job)
        if kept is not None:  # the owner's reserved job will need its room back
            gpu, cpu, jobs = gpu + kept.gpu, cpu + kept.cpu, jobs + 1
        max_gpus = None if info.max_user_gpus is None else info.max_user_gpus * MILLI
        checks = (  # (GPUs in thousandths: `sharing.gpu_milli`)
            ("running GPUs", max_gpus, gpu, session.min_gpu_milli(job), _gpus),
            ("running CPUs", info.max_user_cpus, cpu, need.cpu, _cores),
            ("running jobs", info.max_user_jobs, jobs, more_jobs, str),
        )
        for label, limit, used, more, show in checks:
            if limit is not None and more and used + more > limit:
                return Status(
                    Code.USER_LIMIT,
                    f'per-user limit of queue "{info.name}": {label} {show(used)}/{show(limit)}'
                    f" in use by the owner{_and_kept(kept)}, this job needs {show(more)} more",
                )
        return None

    def _use_of(self, session: Session, queue: str, owner: str) -> list[int]:
        if self._bound is not session.bound:  # a new cycle: count again
            self._bound, self._seen, self._evictions = session.bound, 0, 0
            self.use, self.counted = {}, {}
            for running in session.running:
                held = [_counted(t) for t in running.tasks if t.state in HOLDS_RESOURCES]
                if held and running.queue in session.user_limited:
                    self._add(running, held, +1)
        for job, task, _node, _devices in session.bound[self._seen :]:
            if job.queue in session.user_limited:
                self._add(job, [_counted(task)], +1)
        self._seen = len(session.bound)
        for evict in session.evictions[self._evictions :]:
            victim = session.jobs.get(evict.job_id)
            if victim is not None and evict.job_id in self.counted:
                self._add(victim, [self.counted.pop(evict.job_id)], -1)
        self._evictions = len(session.evictions)
        return self.use.get((queue, owner), [0, 0, 0])

    def _add(self, job: JobInfo, held: list[Resources], sign: int) -> None:
        use = self.use.setdefault((job.queue, job.owner), [0, 0, 0])
        total = Resources()
        for request in held:
            total = total + request
        use[0] += sign * total.gpu
        use[1] += sign * total.cpu
        if sign > 0:
            use[2] += 0 if job.id in self.counted else 1
            self.counted[job.id] = self.counted.get(job.id, Resources()) + total
        else:
            use[2] -= 1


def _counted(task: TaskInfo) -> Resources:
    """What a task counts for under per-user limits: its cpu and its GPUs in thousandths."""
    return Resources(task.resources.cpu, task.resources.memory, sharing.gpu_milli(task))


def _kept_for_reservation(session: Session, job: JobInfo) -> Resources | None:
    """What the owner's job holding EASY's reservation in the same queue will need (GPUs in
    thousandths): a job of the same owner and queue may start only within the room the
    holder leaves under the owner's limits, however soon it ends. One that ended before the
    reservation's start would still hold the owner's room meanwhile: the holder would then
    wait on its owner's limit instead of for nodes, and a job held by a limit holds no
    reservation, so the nodes kept for it could go to others (Hypothesis found the holder
    so delayed in test_fraction_gangs_never_delay_the_reservation). Backfill never delays
    the holder, whether by nodes or by its owner's limits."""
    reservation = session.reservation
    if reservation is None or not reservation.placed:
        return None
    holder = reservation.job
    if holder.id == job.id or holder.queue != job.queue or holder.owner != job.owner:
        return None
    need = session.min_request(holder)
    return Resources(need.cpu, need.memory, session.min_gpu_milli(holder))


def _and_kept(kept: Resources | None) -> str:
    return "" if kept is None else " with what its reserved job will need"


def _cores(millicores: int) -> str:
    return f"{millicores / 1000:g}"


def _gpus(milli: int) -> str:
    """GPUs counted in thousandths, as people write them: `2`, `0.25`, `0.571`."""
    return f"{milli / MILLI:g}"


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

    def __init__(self) -> None:
        # (id of a list of groups, request) -> (the list, its groups' `scan_buckets`)
        self.scans: dict[
            tuple[int, Resources],
            tuple[list[LabelGroup], list[dict[int, dict[str, NodeView]]]],
        ] = {}

    def node_order(
        self, session: Session, task: TaskInfo, groups: list[LabelGroup]
    ) -> Iterator[NodeView]:
        # Nodes with too little cpu or memory free for any pending task are left out.
        scans = self._scans(task.resources, groups)
        # A scan for a task with devices is never resumed after a placement (`NodeScan`
        # starts over for each such task), and one `Session.walk_once` asks for changes
        # nothing while it walks: nothing moves while it walks a bucket, so it need not
        # copy the bucket first, which costs as much as the bucket is large when the first
        # node takes the task. Other scans walk a copy.
        lazy = task.resources.gpu > 0 or session.walking_once
        # A fraction may also go on a node without a whole free device (onto a shared one).
        least = 0 if task.gpu_share else task.resources.gpu
        return _binpack_walk(scans, range(least, session.max_devices + 1), lazy)

    def _scans(
        self, request: Resources, groups: list[LabelGroup]
    ) -> list[dict[int, dict[str, NodeView]]]:
        """Each group's `scan_buckets` for `request`, kept per request and list of groups
        (a group's buckets are the same dicts as long as the group lives: only what they
        hold changes; a list of groups not seen before, as after the index is rebuilt, is
        asked again)."""
        known = self.scans.get((id(groups), request))
        if known is not None and known[0] is groups:
            return known[1]
        if len(self.scans) >= 256:
            self.scans.clear()
        scans = [group.scan_buckets(request) for group in groups]
        self.scans[(id(groups), request)] = (groups, scans)
        return scans


def _binpack_walk(
    scans: list[dict[int, dict[str, NodeView]]], counts: range, lazy: bool
) -> Iterator[NodeView]:
    """The nodes of `scans`' buckets, bucket by bucket in `counts` order (copied first
    unless `lazy`)."""
    for free in counts:
        for buckets in scans:
            bucket = buckets.get(free)
            if bucket:
                yield from bucket.values() if lazy else list(bucket.values())


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
        UserLimitPlugin(),
        GangPlugin(),
        PredicatesPlugin(),
        BinpackPlugin() if config.node_order == "binpack" else SpreadPlugin(),
    ]
    if config.fair_share:
        plugins.insert(1, DRFPlugin())
    plugins += list(config.extra_plugins)
    return [p for p in plugins if p.name not in config.disabled_plugins]
