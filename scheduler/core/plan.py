"""Where every pending job stands: its position in its queue and when it should start.

Run after a cycle, on the snapshot and the cycle's decisions (jobs bound now hold their
resources from now for their walltime, evicted ones give theirs back now). Like
`squeue --start` over a conservative-backfill plan:

- Positions: candidates ranked per queue by the core's job order (`Session.job_key`).
- Estimates: jobs in the order allocate considers them (queues by `Session.queue_key`, the
  queue to serve next chosen again after each job, as if that job had started) are placed one
  by one on a per-node resource-time profile (scheduler/core/timeline.py), each at the
  earliest time its whole gang fits for its walltime, around the jobs planned before it. A
  job with no walltime holds what it takes for ever. The estimate is unknown (None) when no
  such time exists (what it needs is held by jobs without walltime), when the core says it
  cannot start for a reason waiting does not fix (never fits, queue closed or at its quota),
  or beyond the first `depth` jobs (the work is bounded). Under strict order without
  backfill, no job is planned before the one ahead of it.
- The job holding the core's backfill reservation starts exactly when the core says (a MIG
  request no earlier than an instance of its profile is free, which the core's reservation
  counts too); with an unknown start it keeps, from now on, the nodes it would take once
  everything ends, as the core keeps them for it.
- Fractions of a GPU: a job of one fraction may join a device shared over its whole run
  (`_Slot`); a gang's fractions are packed onto the devices they open (`_Opened`); a MIG
  request needs a free instance of its profile over its whole run (`_instances`).
- Per-user running limits (`UserLimit`): in a queue with limits, each owner's room under
  them (GPUs, CPUs, jobs) is a profile too, given back as the owner's running jobs end and
  taken by the owner's jobs planned before; a job starts no earlier than the room for it
  stays there over its whole run, as the core starts it only then.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from math import nextafter

from scheduler.core import predict, sharing
from scheduler.core.actions import enqueue, in_order
from scheduler.core.cycle import Bind, CycleResult
from scheduler.core.model import JobInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session
from scheduler.core.status import Code, Status
from scheduler.core.timeline import INF, Free, Timeline, as_free
from scheduler.core.types import HOLDS_RESOURCES, NodeView

MILLI = sharing.MILLI

DEFAULT_DEPTH = 500
# A gang not placed after this many tries at moments where enough is free at that instant
# (but not for its whole walltime) is left unknown: the work per job stays bounded.
MAX_GANG_CHECKS = 64
# A job not placed after this many moves past a moment its owner's limit had no room at is
# left unknown.
MAX_LIMIT_MOVES = 64
# "No limit" in a dimension of an owner's room.
UNLIMITED = 1 << 62
# The core's verdicts that no passing of time resolves by itself: no estimate.
NO_ESTIMATE = frozenset(
    {
        Code.NEVER_FITS,
        Code.QUEUE_QUOTA,
        Code.QUEUE_CLOSED,
        Code.QUEUE_MISSING,
        Code.SCHEDULER_ERROR,
        Code.NOTHING_TO_PLACE,
    }
)


@dataclass
class Plan:
    positions: dict[int, int] = field(default_factory=dict)  # job id -> 1 = next in its queue
    starts: dict[int, float | None] = field(default_factory=dict)  # job id -> epoch s or None
    planned: int = 0  # jobs the plan looked at (at most `depth`)


def plan_starts(
    snapshot: Snapshot,
    result: CycleResult,
    config: SchedulingPolicy | None = None,
    depth: int = DEFAULT_DEPTH,
) -> Plan:
    """Positions and start estimates of every job still waiting after `result`."""
    session = _waiting_session(snapshot, result, config)
    config = session.config
    plan = Plan(positions=queue_positions(session))
    planner = _Planner(session, result.pending, config)
    for job in _plan_order(session):
        if plan.planned >= depth:
            break
        plan.starts[job.id] = planner.place(job)
        plan.planned += 1
    for job_id in plan.positions:
        plan.starts.setdefault(job_id, None)
    return plan


def plan_positions(
    snapshot: Snapshot, result: CycleResult, config: SchedulingPolicy | None = None
) -> dict[int, int]:
    """Only the queue positions (cheap: one ordering, no planning)."""
    return queue_positions(_waiting_session(snapshot, result, config))


def _waiting_session(
    snapshot: Snapshot, result: CycleResult, config: SchedulingPolicy | None
) -> Session:
    config = config or SchedulingPolicy()
    session = Session(after_cycle(snapshot, result), config, default_plugins(config))
    enqueue(session)
    return session


def fingerprint(snapshot: Snapshot, result: CycleResult, config: SchedulingPolicy | None) -> int:
    """Everything a plan depends on except the passing of time: two cycles with the same
    fingerprint (and close enough in time) have the same plan, so it need not be made again."""
    return hash(
        (
            config,
            tuple((n.name, n.state, n.allocatable, tuple(n.labels.items()), len(n.devices),
                   n.sharing)
                  for n in snapshot.nodes),
            tuple((q.name, q.weight, q.priority, q.capability, q.open, q.max_user_gpus,
                   q.max_user_cpus, q.max_user_jobs, q.limits_exempt) for q in snapshot.queues),
            tuple(
                (j.id, j.state, j.priority, j.walltime, j.predicted, j.suspend_requested, j.queue,
                 tuple((t.id, t.state, t.node, t.started_at) for t in j.tasks))
                for j in snapshot.jobs
            ),
            tuple(result.binds),
            tuple(result.evictions),
            tuple((j, s.code, s.estimated_start) for j, s in result.pending.items()),
        )
    )  # fmt: skip


def after_cycle(snapshot: Snapshot, result: CycleResult) -> Snapshot:
    """The snapshot as the cycle leaves it: bound tasks run from now, victims release."""
    binds = {b.task_id: b for b in result.binds}
    bound_jobs = {b.job_id for b in result.binds}
    evicted = {e.job_id for e in result.evictions}
    jobs = []
    for job in snapshot.jobs:
        if job.id in bound_jobs:
            tasks = [_bound(t, binds.get(t.id), snapshot.now) for t in job.tasks]
            job = replace(job, state="Running", tasks=tasks)
        elif job.id in evicted:
            tasks = [
                replace(t, state="Releasing") if t.state in ("Assigned", "Running") else t
                for t in job.tasks
            ]
            job = replace(job, tasks=tasks)
        jobs.append(job)
    return Snapshot(now=snapshot.now, nodes=snapshot.nodes, queues=snapshot.queues, jobs=jobs)


def _bound(task: TaskInfo, bind: Bind | None, now: float) -> TaskInfo:
    if bind is None:
        return task
    return replace(task, state="Assigned", node=bind.node, devices=bind.devices, started_at=now)


def waiting(session: Session) -> list[JobInfo]:
    """Jobs still waiting to start, in the core's job order."""
    return sorted((j for j in session.candidates if j.state != "Running"), key=session.job_key)


def queue_positions(session: Session) -> dict[int, int]:
    seen: dict[str, int] = defaultdict(int)
    positions = {}
    for job in waiting(session):
        seen[job.queue] += 1
        positions[job.id] = seen[job.queue]
    return positions


def _plan_order(session: Session) -> Iterator[JobInfo]:
    """Admitted waiting jobs, queue by queue as allocate serves them (the core's `in_order`);
    each job planned counts towards its queue's share, as it will once it starts."""
    for job in in_order(session, skip=lambda j: j.state == "Running"):
        yield job
        queue = session.queues[job.queue]
        queue.allocated = queue.allocated + _total(_gang(session, job))


def _gang(session: Session, job: JobInfo) -> list[TaskInfo]:
    """The tasks that must start together for the job to start."""
    return session.pending_tasks(job)[: max(1, session.needed(job))]


class _Planner:
    """The resource-time profile of every Ready node, and the jobs placed on it so far."""

    def __init__(self, session: Session, pending: dict[int, Status], config: SchedulingPolicy):
        self.session = session
        self.pending = pending
        self.nodes = [n for n in session.nodes if n.ready]
        # Per shared device, the occupant whose leaving gives it back whole: the last to
        # leave, a Releasing or suspended one now (not the core's choice, which plans
        # those by their walltime or not at all).
        releasers = sharing.releasers(self.nodes, lambda j, t: _leaves_at(session, j, t))
        self.lines = {
            n.name: Timeline(session.now, as_free(n.free()), _releases(session, n, releasers))
            for n in self.nodes
        }
        # Strict order without backfill: nothing starts before the job ahead of it.
        self.in_order = config.strict_order and "backfill" not in config.actions
        self.binpack = config.node_order == "binpack"
        self.floor = session.now
        self._eligible: dict[tuple[object, ...], list[NodeView]] = {}
        self.limits = _OwnerRoom(session)
        # Per node, the devices holding fractions over a while, which a planned fraction
        # may join instead of opening a device of its own (`_Slot`).
        self.slots = {n.name: _running_slots(session, n) for n in self.nodes}
        # Per (node, MIG profile), its instances free over time (`_instances`).
        self.instance_lines: dict[tuple[str, str], Timeline | None] = {}

    def place(self, job: JobInfo) -> float | None:
        """Plan the job at its earliest start and return it (None: unknown)."""
        status = self.pending.get(job.id)
        gang = _gang(self.session, job)
        if (status is not None and status.code in NO_ESTIMATE) or not gang:
            return None
        after = self.floor
        if status is not None and status.code == Code.RESERVED:
            if status.estimated_start is None:
                self._keep_for(job, gang)
                self._unknown()
                return None
            after = max(after, status.estimated_start)
        ran = predict.runtime(job)
        duration = (job.walltime or INF) if job.predicted is None or ran is None else ran
        room = self.limits.line(job)
        need = self.limits.need(job) if room is not None else (0, 0, 0)
        # A limit is asked only where the job needs more (an owner already over a lowered
        # limit still starts a job that needs none of that): no room is needed there.
        ask = (need[0] or -UNLIMITED, need[1] or -UNLIMITED, need[2] or -UNLIMITED)
        found = self._within_limit(job, gang, duration, after, room, ask)
        if found is None:
            self._unknown()
            return None
        start, placement = found
        # Strict order: the jobs after it wait for it, unless the owner's limit put it off
        # (a job held by its owner's limit holds up no one).
        holds_up = self.in_order and (
            room is None or start == self._on_resources(job, gang, duration, after)
        )
        for name, amount in placement:
            self.lines[name].hold(start, start + duration, amount)
        self._hold_instances(gang, placement, start, start + duration)
        if _fraction(gang):
            self._share_slot(gang[0], start, duration, placement[0])
        if room is not None:
            room.hold(start, start + duration, need)
        if holds_up:
            self.floor = start
        return start

    def _within_limit(
        self,
        job: JobInfo,
        gang: list[TaskInfo],
        duration: float,
        after: float,
        room: Timeline | None,
        ask: Free,
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        """The earliest start where the gang fits on the nodes and, with a limited owner,
        the owner's room holds `ask` over the job's whole run too."""
        for _ in range(MAX_LIMIT_MOVES):
            if room is not None:
                moved = room.earliest(ask, duration, after, INF)
                if moved is None:
                    return None
                after = max(after, moved)
            found = self._earliest(job, gang, duration, after) if after < INF else None
            if found is None or room is None:
                return found
            left = room.window(found[0], found[0] + duration)
            if all(f >= n for f, n in zip(left, ask, strict=True)):
                return found
            after = found[0]
        return None

    def _on_resources(
        self, job: JobInfo, gang: list[TaskInfo], duration: float, after: float
    ) -> float | None:
        """When the gang could start on the nodes alone (its owner's limit aside)."""
        found = self._earliest(job, gang, duration, after) if after < INF else None
        return None if found is None else found[0]

    def _unknown(self) -> None:
        if self.in_order:
            self.floor = INF  # strict order: nothing after an unknown start is known

    def _earliest(
        self, job: JobInfo, gang: list[TaskInfo], duration: float, after: float
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        if len(gang) == 1:
            return self._earliest_one(job, gang[0], duration, after)
        return self._earliest_gang(job, gang, duration, after)

    def _earliest_gang(
        self, job: JobInfo, gang: list[TaskInfo], duration: float, after: float
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        """Sweep the nodes' breakpoints in time order, keeping per task shape how many tasks
        the nodes could hold at that instant; only where that count is enough for the gang is
        the gang placed for real over its whole window (at most MAX_GANG_CHECKS times)."""
        wanted: dict[_Shape, int] = {}
        eligible: dict[_Shape, set[str]] = {}
        for task in gang:
            shape = _shape(task)
            wanted[shape] = wanted.get(shape, 0) + 1
            eligible.setdefault(shape, {n.name for n in self.eligible(job, task)})
        counts = {shape: dict.fromkeys(nodes, 0) for shape, nodes in eligible.items()}
        totals = dict.fromkeys(wanted, 0)
        short = len(wanted)  # shapes the nodes cannot hold enough of at this instant
        checks = 0
        events = self._events(set().union(*eligible.values()), after)
        for i, (moment, name, free) in enumerate(events):
            for shape, nodes in counts.items():
                old = nodes.get(name)
                if old is None:
                    continue
                count = _how_many(free, shape)
                if count != old:
                    was_short = totals[shape] < wanted[shape]
                    totals[shape] += count - old
                    nodes[name] = count
                    short += (totals[shape] < wanted[shape]) - was_short
            if short or (i + 1 < len(events) and events[i + 1][0] == moment):
                continue  # not enough at this instant, or more changes at this moment
            placement = self._first_fit(job, gang, moment, duration, counts)
            if placement is not None:
                return moment, placement
            checks += 1
            if checks >= MAX_GANG_CHECKS:
                return None
        return None

    def _events(self, names: set[str], after: float) -> list[tuple[float, str, Free]]:
        """Every change of free resources on these nodes from `after` on, in time order."""
        events: list[tuple[float, str, Free]] = []
        for name in names:
            times, free = self.lines[name].times, self.lines[name].free
            first = max(0, bisect_right(times, after) - 1)
            events.append((after, name, free[first]))
            events.extend(
                zip(
                    times[first + 1 :],
                    [name] * (len(times) - first - 1),
                    free[first + 1 :],
                    strict=True,
                )
            )
        events.sort(key=lambda e: e[0])
        return events

    def _earliest_one(
        self, job: JobInfo, task: TaskInfo, duration: float, after: float
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        """The earliest node; among nodes free at the same time, binpack's choice (the one
        with the fewest GPUs free then), as the core would pick. A fraction of a GPU may
        also join a device shared over its whole run (`_join`), which it does at a tie."""
        whole = self._earliest_whole(job, task, duration, after)
        if not _fraction([task]):
            return whole
        before = INF if whole is None else nextafter(whole[0], INF)
        joined = self._join(job, task, duration, after, before)
        return joined if joined is not None else whole

    def _join(
        self, job: JobInfo, task: TaskInfo, duration: float, after: float, before: float
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        """The earliest start in [after, before) on a device shared over the whole run with
        room for the fraction (the node's cpu and memory free for it too)."""
        need = (task.resources.cpu, task.resources.memory, 0)
        best: tuple[float, str] | None = None
        for node in self.eligible(job, task):
            line = self.lines[node.name]
            for slot in self.slots[node.name]:
                if not slot.takes(task, duration):
                    continue
                last = INF if slot.end == INF else nextafter(slot.end - duration, INF)
                limit = min(last, best[0] if best else before)
                found = line.earliest(need, duration, max(slot.start, after), limit)
                if found is not None and (best is None or found < best[0]):
                    best = (found, node.name)
        return None if best is None else (best[0], [(best[1], need)])

    def _share_slot(
        self, task: TaskInfo, start: float, duration: float, at: tuple[str, Free]
    ) -> None:
        """A fraction planned from `start`: it joined a shared device (no whole device
        taken), or opened one that others may join while it runs."""
        name, amount = at
        if amount[2]:
            node = self.session.node_by_name[name]
            memory = min(node.device_memory.values(), default=0)
            self.slots[name].append(
                _Slot(start, start + duration, sharing.MILLI - task.gpu_share,
                      memory - task.gpu_memory)
            )  # fmt: skip
            return
        for slot in self.slots[name]:
            if slot.takes(task, duration) and slot.start <= start and start + duration <= slot.end:
                slot.share -= task.gpu_share
                slot.memory -= task.gpu_memory
                return

    def _earliest_whole(
        self, job: JobInfo, task: TaskInfo, duration: float, after: float
    ) -> tuple[float, list[tuple[str, Free]]] | None:
        """`_earliest_one` on whole devices (a fraction opening one of its own)."""
        need = as_free(task.resources)
        best: tuple[float, int] | None = None
        where = ""
        for node in self.eligible(job, task):
            line = self.lines[node.name]
            before = INF if best is None else nextafter(best[0], INF)
            if task.gpu_mig:
                found = self._with_instance(node.name, task, need, duration, after, before)
            else:
                found = line.earliest(need, duration, after, before)
            if found is None:
                continue
            key = (found, line.window(found, found)[2] if self.binpack else 0)
            if best is None or key < best:
                best, where = key, node.name
        return None if best is None else (best[0], [(where, need)])

    def _first_fit(
        self,
        job: JobInfo,
        gang: list[TaskInfo],
        moment: float,
        duration: float,
        now_free: dict[_Shape, dict[str, int]],
    ) -> list[tuple[str, Free]] | None:
        """The gang placed first fit in node order on what stays free over the window;
        nodes with no room for a task at `moment` itself (`now_free`) are not looked at.
        Its fractions share the devices its earlier fractions opened (`_Opened`)."""
        room: dict[str, list[int]] = {}

        def instances(name: str, profile: str) -> int:
            line = self._instances(name, profile)
            return 0 if line is None else line.window(moment, moment + duration)[2]

        opened = _Opened(instances)
        placement = []
        for task in gang:
            counts = now_free[_shape(task)]
            for node in self.eligible(job, task):
                if not counts[node.name]:
                    continue
                free = room.get(node.name)
                if free is None:
                    free = room[node.name] = list(
                        self.lines[node.name].window(moment, moment + duration)
                    )
                need = opened.take(free, node.name, task)
                if need is not None:
                    placement.append((node.name, need))
                    break
            else:
                return None
        return placement

    def _keep_for(self, job: JobInfo, gang: list[TaskInfo]) -> None:
        """The reserved job with an unknown start: hold, from now on, where it would go
        once everything has ended (the core protects those nodes for it)."""
        room = {n.name: list(as_free(n.capacity())) for n in self.nodes}
        by_name = self.session.node_by_name
        opened = _Opened(lambda name, profile: by_name[name].mig_total.get(profile, 0))
        placement = []
        for task in gang:
            for node in self.eligible(job, task):
                need = opened.take(room[node.name], node.name, task)
                if need is not None:
                    placement.append((node.name, need))
                    break
            else:
                return
        for name, amount in placement:
            self.lines[name].hold(self.session.now, INF, amount)
        self._hold_instances(gang, placement, self.session.now, INF)

    def _instances(self, name: str, profile: str) -> Timeline | None:
        """The node's free instances of the MIG profile over time (in the devices'
        place: (0, 0, count)), as those held give them back; None: it has none."""
        key = (name, profile)
        if key in self.instance_lines:
            return self.instance_lines[key]
        session = self.session
        node = session.node_by_name[name]
        line = None
        if profile in node.mig_profiles:
            free, ends = sharing.instance_releases(
                node, profile, lambda j, t: _leaves_at(session, j, t)
            )
            releases: list[tuple[float, Free]] = [
                (INF if at is None else at, (0, 0, 1)) for at in ends
            ]
            line = Timeline(session.now, (0, 0, free), releases)
        self.instance_lines[key] = line
        return line

    def _with_instance(
        self, name: str, task: TaskInfo, need: Free, duration: float, after: float, before: float
    ) -> float | None:
        """The earliest start in [after, before) where the node has the MIG task's cpu and
        memory and a free instance of its profile over the whole run."""
        line, instances = self.lines[name], self._instances(name, task.gpu_mig)
        if instances is None:
            return None
        for _ in range(MAX_LIMIT_MOVES):
            found = line.earliest(need, duration, after, before)
            if found is None:
                return None
            at = instances.earliest((0, 0, 1), duration, found, before)
            if at is None or at == found:
                return at
            after = at
        return None

    def _hold_instances(
        self, gang: list[TaskInfo], placement: list[tuple[str, Free]], start: float, end: float
    ) -> None:
        """The gang's MIG tasks take an instance of their profile where they were placed
        (`placement` is in the gang's order)."""
        for task, (name, _amount) in zip(gang, placement, strict=True):
            if task.gpu_mig:
                line = self._instances(name, task.gpu_mig)
                if line is not None:
                    line.hold(start, end, (0, 0, 1))

    def eligible(self, job: JobInfo, task: TaskInfo) -> list[NodeView]:
        """Ready nodes that could ever take the task, in node order (cached per shape: the
        core's predicates depend on the task and the node only)."""
        fraction = (task.gpu_share, task.gpu_memory, task.gpu_modes, task.gpu_mig)
        key = (task.resources, tuple(sorted(task.node_selector.items())), fraction)
        nodes = self._eligible.get(key)
        if nodes is None:
            nodes = [
                n
                for n in self.nodes
                if self.session.predicate(job, task, n) is None
                and task.resources.fits_in(n.capacity())
                and (not task.gpu_share or sharing.never_reason(n, task) is None)
            ]
            self._eligible[key] = nodes
        return nodes


class _OwnerRoom:
    """Each limited owner's room under their queue's per-user limits over time, as a
    timeline of (CPUs, jobs, GPUs in thousandths) left (the core's `UserLimitPlugin`
    counts the same: a fraction as its share, a MIG instance as its slices of seven):
    their running jobs give theirs back as they end (as the nodes get them back)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lines: dict[tuple[str, str], Timeline] = {}

    def limited(self, job: JobInfo) -> bool:
        queue = self.session.queues.get(job.queue)
        return (
            queue is not None
            and queue.info.user_limited
            and job.owner not in queue.info.limits_exempt
        )

    def need(self, job: JobInfo) -> Free:
        need = self.session.min_request(job)
        return (need.cpu, 0 if job.state == "Running" else 1, self.session.min_gpu_milli(job))

    def line(self, job: JobInfo) -> Timeline | None:
        """The owner's room in the job's queue (None: no limit applies)."""
        if not self.limited(job):
            return None
        key = (job.queue, job.owner)
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = self._open(job.queue, job.owner)
        return line

    def _open(self, queue_name: str, owner: str) -> Timeline:
        session = self.session
        info = session.queues[queue_name].info
        gpus = None if info.max_user_gpus is None else info.max_user_gpus * MILLI
        cpu, jobs, gpu = (
            UNLIMITED if limit is None else limit
            for limit in (info.max_user_cpus, info.max_user_jobs, gpus)
        )
        releases = []
        for running in session.running:
            if running.queue != queue_name or running.owner != owner:
                continue
            held = [t for t in running.tasks if t.state in HOLDS_RESOURCES]
            if not held:
                continue
            ends = [_release_at(session, running, t) for t in held]
            for task, end in zip(held, ends, strict=True):
                milli = sharing.gpu_milli(task)
                cpu, gpu = cpu - task.resources.cpu, gpu - milli
                releases.append((end, (task.resources.cpu, 0, milli)))
            jobs -= 1
            releases.append((max(ends), (0, 1, 0)))
        return Timeline(session.now, (cpu, jobs, gpu), releases)


@dataclass
class _Slot:
    """A device holding fractions in the plan, shared from `start` to `end` (INF: for
    ever), with `share` (thousandths) and `memory` (bytes) not yet promised: a running
    shared device until its last occupant ends (when the plan has it back whole), or one a
    planned fraction opened, for that fraction's run. Counted without regard to when
    within the span each joiner runs: never more promised than the device has."""

    start: float
    end: float
    share: int
    memory: int

    def takes(self, task: TaskInfo, duration: float) -> bool:
        return (
            self.share >= task.gpu_share
            and self.memory >= task.gpu_memory
            and self.end - self.start >= duration
        )


def _fraction(gang: list[TaskInfo]) -> bool:
    """A gang of one fraction of a GPU (not a MIG instance): the plan packs those."""
    return len(gang) == 1 and bool(gang[0].gpu_share) and not gang[0].gpu_mig


def _running_slots(session: Session, node: NodeView) -> list[_Slot]:
    """The node's devices holding fractions now, each shared until its last occupant ends."""
    ends: dict[int, float] = {}
    for running, task in node.tasks:
        if task.gpu_share and not task.gpu_mig:
            for device in task.devices:
                ends[device] = max(ends.get(device, 0.0), _release_at(session, running, task))
    return [
        _Slot(session.now, ends.get(d, session.now), free, node.shared_memory.get(d, 0))
        for d, free in sorted(node.shared.items())
    ]


# A task's shape in a gang plan: what it asks of a node (cpu, memory, whole devices) and,
# for a fraction of a GPU, how many like it share one device (0: whole devices, no fraction).
_Shape = tuple[Free, int]


def _shape(task: TaskInfo) -> _Shape:
    fraction = task.gpu_share and not task.gpu_mig
    return as_free(task.resources), sharing.per_device(task) if fraction else 0


class _Opened:
    """The devices a gang's fractions opened on each node in one placement, with the share
    left on each: a later fraction of the gang joins one with room rather than opening a
    device of its own, as the core puts a gang's fractions together on a device. Its MIG
    tasks each take an instance of their profile of those `instances` says the node has
    (node, profile -> how many)."""

    def __init__(self, instances: Callable[[str, str], int]) -> None:
        self.left: dict[str, list[int]] = {}
        self.instances = instances
        self.taken: dict[tuple[str, str], int] = {}

    def take(self, free: list[int], name: str, task: TaskInfo) -> Free | None:
        """Take what the task needs out of the node's `free` (cpu, memory, devices) if it
        is all there, and return it (None: it is not)."""
        cpu, memory, gpu = task.resources
        if task.gpu_mig:
            key = (name, task.gpu_mig)
            taken = self.taken.get(key, 0)
            if self.instances(name, task.gpu_mig) <= taken or not _take(free, (cpu, memory, 0)):
                return None
            self.taken[key] = taken + 1
            return (cpu, memory, 0)
        if not task.gpu_share:
            need = (cpu, memory, gpu)
            return need if _take(free, need) else None
        left = self.left.setdefault(name, [])
        share = MILLI if task.gpu_memory else task.gpu_share  # (`sharing.per_device`)
        joined = next((i for i, room in enumerate(left) if room >= share), None)
        need = (cpu, memory, 0 if joined is not None else 1)
        if not _take(free, need):
            return None
        if joined is None:
            left.append(MILLI - share)
        else:
            left[joined] -= share
        return need


def _how_many(free: Free, shape: _Shape) -> int:
    """How many tasks of `shape` fit in `free` (fractions as many per device as share it)."""
    (cpu, memory, gpu), per = shape
    most = 1 << 30
    if per:
        most = free[2] * per
    elif gpu:
        most = free[2] // gpu
    if cpu:
        most = min(most, free[0] // cpu)
    if memory:
        most = min(most, free[1] // memory)
    return max(0, most)


def _releases(session: Session, node: NodeView, releasers: set[int]) -> list[tuple[float, Free]]:
    """When each task on the node gives back what it holds: now if it is stopping, at its
    walltime if it has one, never (INF) otherwise. A fraction gives back its device whole
    only if it is the device's last occupant to leave (`releasers`)."""
    return [
        (_release_at(session, running, task),
         (task.resources.cpu, task.resources.memory,
          int(task.id in releasers) if task.gpu_share else len(task.devices)))
        for running, task in node.tasks
    ]  # fmt: skip


def _leaves_at(session: Session, running: JobInfo, task: TaskInfo) -> float | None:
    """`_release_at`, None for never (as `sharing.releaser` takes it)."""
    at = _release_at(session, running, task)
    return None if at == INF else at


def _release_at(session: Session, running: JobInfo, task: TaskInfo) -> float:
    """When a task holding resources gives them back (as `_releases` plans it)."""
    if task.state == "Releasing" or running.suspend_requested:
        return session.now
    if running.walltime is not None and task.started_at is not None:
        correction = session.config.prediction_correction
        ends = predict.end(running, task.started_at, session.now, correction) or 0.0
        return max(session.now, ends)
    return INF


def _total(tasks: list[TaskInfo]) -> Resources:
    total = Resources()
    for task in tasks:
        total = total + task.resources
    return total


def _take(free: list[int], need: Free) -> bool:
    """Take `need` out of `free` (cpu, memory, gpu) if it is all there."""
    if free[0] >= need[0] and free[1] >= need[1] and free[2] >= need[2]:
        free[0], free[1], free[2] = free[0] - need[0], free[1] - need[1], free[2] - need[2]
        return True
    return False
