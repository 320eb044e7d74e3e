"""A standing session: one session kept from cycle to cycle, for replays and what-if runs.

`run_cycle` opens a session on a full snapshot every time: every node view, every running
task and every job's pending tasks are rebuilt, although between two cycles only a few jobs
arrived, finished or started. A standing session is told those changes (`submit`, `finish`)
and applies its own binds, so a cycle costs what changed plus the actions themselves. Its
decisions are those `run_cycle` makes on the equivalent snapshot (pending jobs in arrival
order, then running jobs in start order): `tests/core/test_replay.py` compares them.

It takes no preemptible, suspended or already placed jobs (nothing in it is ever evicted),
and plugins are opened once, not once per cycle.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from scheduler.core import predict, sharing
from scheduler.core.cycle import CycleResult, run_actions
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session, grows, held_resources, need_of, whole_devices
from scheduler.core.types import HOLDS_RESOURCES, NodeView


class StandingSession:
    def __init__(
        self,
        nodes: list[NodeInfo],
        queues: list[QueueInfo],
        config: SchedulingPolicy | None = None,
        explain: bool = False,
    ) -> None:
        config = config or SchedulingPolicy()
        self.session = Session(Snapshot(0.0, nodes, queues, []), config, default_plugins(config))
        self.session.explain_failures = explain
        self.session.standing = True
        self._waiting: set[int] = set()  # jobs among the candidates (and maybe in a queue)

    def submit(self, job: JobInfo) -> None:
        """A new pending job. The session owns it from now on and updates its tasks."""
        if job.preemptible or job.suspend_requested or job.state != "Pending":
            raise ValueError(f"job {job.id}: a standing session takes pending jobs only")
        if any(t.state != "Pending" for t in job.tasks):
            raise ValueError(f"job {job.id}: a standing session takes pending tasks only")
        session = self.session
        session.jobs[job.id] = job
        session.candidates.append(job)
        self._waiting.add(job.id)
        session.need[job.id] = need_of(job)
        self._admit(job)

    def set_usage(self, usage: dict[str, float], shares: dict[str, float]) -> None:
        """New fair-share usage and shares (a replay's finished jobs): the order plugins
        open again on them, as a fresh session on a snapshot carrying them would, and the
        queues are ordered again (here, unless the next cycle does it for the age factor)."""
        session = self.session
        session.usage, session.shares = usage, shares
        for plugin in session.hooks["job_key"]:
            plugin.open(session)
        weights = session.config.priority_weights
        if not weights.age and not weights.off:
            session.refresh_keys()

    def _admit(self, job: JobInfo) -> None:
        """Into its queue in order, or refused with the reason (as `enqueue` decides)."""
        session = self.session
        problem = session.job_valid(job)
        if problem is not None:
            session.refused[job.id] = problem
        elif session.pending_tasks(job):
            bisect.insort(session.queues[job.queue].jobs, job, key=session.job_key)

    def finish(self, job_id: int) -> JobInfo:
        """The job ended: its tasks give back what they hold."""
        session = self.session
        job = session.jobs.pop(job_id)
        session.refused.pop(job_id, None)
        if job_id in self._waiting:
            self._leave(job)
        session.need.pop(job_id, None)
        _remove(session.running, job)
        held = self._release(job)
        queue = session.queues.get(job.queue)
        if queue is not None:
            queue.allocated = queue.allocated - held
        job.state = "Succeeded"
        ends = _drop_ends(session.walltime_ends, job)
        self._ended_shared(job)
        session.forget_job(job_id)
        session.forget_key(job_id)
        session.version += 1
        if ends and len(ends) == len(job.tasks):
            # From its last planned end on, the room is what the plan counted.
            session.carry_plan(max(ends))
        return job

    def _release(self, job: JobInfo) -> Resources:
        """Give back what the job's tasks hold on their nodes; the total they held."""
        session = self.session
        by_name = session.node_by_name
        cpu = memory = gpu = 0
        nodes: dict[NodeView, None] = {}  # where its tasks ended, in order
        for task in job.tasks:
            if task.state not in HOLDS_RESOURCES:
                continue
            node = by_name.get(task.node or "")
            if node is None:
                continue
            request = task.resources
            node.free_cpu += request.cpu
            node.free_memory += request.memory
            freed = self._free_devices(node, task)
            session.freed(node, request.cpu, request.memory, freed)
            nodes[node] = None
            holds = held_resources(task)
            cpu, memory, gpu = cpu + holds.cpu, memory + holds.memory, gpu + holds.gpu
            queue = session.queues.get(job.queue)
            if queue is not None:
                queue.shared_gpu -= task.gpu_share
            task.state = "Succeeded"
        for node in nodes:
            # Every task of the job that held resources on the node ended.
            held = node.tasks
            node.tasks = [] if len(held) == 1 else [t for t in held if t[0] is not job]
        return Resources(cpu, memory, gpu)

    def _ended_shared(self, job: JobInfo) -> None:
        """The job's fractions ended: the other occupants of their devices decide again which
        of them gives the device back whole."""
        session = self.session
        for task in job.tasks:
            node = session.node_by_name.get(task.node or "")
            if task.gpu_share and node is not None:
                session.releasers.discard(task.id)
                for device in task.devices:
                    session.recount_releaser(node, device)

    def _free_devices(self, node: NodeView, task: TaskInfo) -> int:
        """Give the task's devices back; how many are whole and free again (a shared one
        only once its last fraction is gone)."""
        if not task.devices:
            return 0
        self.session.index_dirty = True
        if task.gpu_share:
            return sum(sharing.give_back(node, task, d) for d in task.devices)
        node.free_devices = sorted(node.free_devices + list(task.devices))
        return len(task.devices)

    def _plan_stands(self, started: Iterable[JobInfo], now: float) -> bool:
        """Do the walltime ends of what started leave the reservation plan as it was? Those
        backfilled after it end before its start; the others held their room in it with no
        end, so an end after its start changes nothing before it."""
        plan = next(iter(self.session.reservations.values()), None)
        if plan is None or plan[1][0] is None:
            return False
        start = plan[1][0]
        harmless = self.session.plan_harmless
        return all(
            job.id in harmless or ((ran := predict.runtime(job)) is not None and now + ran > start)
            for job in started
        )

    def cycle(self, now: float) -> CycleResult:
        """Run the actions at `now` and start what they bound."""
        session = self.session
        session.begin_cycle(now)
        session.raise_outlived()
        weights = session.config.priority_weights
        if weights.age and not weights.off:
            session.refresh_keys()  # waiting raises the age factor: the order moves
        result = run_actions(session)
        self._start(now)
        return result

    def _start(self, now: float) -> None:
        """Start the tasks the cycle bound (`session.bound`, the binds' own objects)."""
        session = self.session
        bound = session.bound
        if not bound:
            return
        started: dict[int, JobInfo] = {}
        ends = session.walltime_ends
        planned = {job.id: predict.runtime(job) for job, *_ in bound}
        for job, task, node, devices in bound:
            task.state, task.node, task.devices, task.started_at = (
                "Running", node.name, devices, now,
            )  # fmt: skip
            node.tasks.append((job, task))
            started[job.id] = job
            ran = planned[job.id]
            if ran is not None:  # (as `Session.end_entries` does, in the same loop)
                request = task.resources
                release = (
                    request
                    if request.gpu == len(devices) and not task.gpu_share
                    else Resources(request.cpu, request.memory, whole_devices(task))
                )  # (a fraction's end gives back its device if it is the last: below)
                ends.append((now + ran, node.name, task.id, job.id, release))
        ends.sort()
        self._recount_shared(bound)
        session.version += 1
        if self._plan_stands(started.values(), now):
            session.carry_plan()
        for job in started.values():
            session.forget_job(job.id)
            if job.state != "Running":
                job.state = "Running"
                session.running.append(job)
            if grows(job):
                session.need[job.id] = need_of(job)
            else:
                session.need.pop(job.id, None)
                self._leave(job)

    def _recount_shared(
        self, bound: list[tuple[JobInfo, TaskInfo, NodeView, tuple[int, ...]]]
    ) -> None:
        """The fractions bound have started, with their ends: the devices they pinned
        (`Session.pin_shared`) come back whole at their last occupant's end again."""
        session = self.session
        session.pinned.clear()
        shared = {(node, devices[0]): None for _job, task, node, devices in bound if task.gpu_share}
        for node, device in shared:
            session.recount_releaser(node, device)

    def _leave(self, job: JobInfo) -> None:
        """Out of the candidates and its queue (found by identity: most leave near the
        front)."""
        self._waiting.discard(job.id)
        _remove(self.session.candidates, job)
        queue = self.session.queues.get(job.queue)
        if queue is not None:
            _remove(queue.jobs, job)


def _drop_ends(ends: list[tuple[float, str, int, int, Resources]], job: JobInfo) -> list[float]:
    """Take the job's planned ends out of the sorted list; return them. Planned by walltime,
    each is at its task's start plus the walltime, so only the entries at those moments are
    looked at; a predicted end may have been raised since: the whole list is."""
    if job.walltime is None:
        return []  # it has none
    if job.predicted is not None:
        dropped = [e[0] for e in ends if e[3] == job.id]
        ends[:] = [e for e in ends if e[3] != job.id]
        return dropped
    moments = {t.started_at + job.walltime for t in job.tasks if t.started_at is not None}
    dropped = []
    for moment in moments:
        first = bisect.bisect_left(ends, (moment,))
        last = first
        while last < len(ends) and ends[last][0] == moment:
            last += 1
        kept = [e for e in ends[first:last] if e[3] != job.id]
        dropped.extend([moment] * (last - first - len(kept)))
        ends[first:last] = kept
    return dropped


def _remove(jobs: list[JobInfo], job: JobInfo) -> None:
    for i, other in enumerate(jobs):
        if other is job:
            del jobs[i]
            return
