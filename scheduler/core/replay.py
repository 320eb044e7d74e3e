"""Discrete-event replay of a job trace through the core: at every arrival and completion
the core runs a cycle and its binds start jobs at that time.

Two paths decide the same: `incremental=True` keeps one standing session and tells it what
arrived and finished; `incremental=False` builds a full snapshot and calls `run_cycle` at
every event, as a deployment does (the reference the fast path is tested against).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.resources import Resources
from scheduler.core.standing import StandingSession
from scheduler.core.status import Code


@dataclass
class TraceJob:
    """A job of a trace: `tasks` alike tasks that start together (a gang), each asking for
    `resources`; `walltime` is what the scheduler is told, `runtime` how long it runs."""

    id: int
    submit: float
    tasks: int
    resources: Resources
    runtime: float
    walltime: float | None
    queue: str = "default"
    priority: int = 0
    node_selector: dict[str, str] = field(default_factory=dict)
    owner: str = ""


@dataclass
class ReplayResult:
    starts: dict[int, float] = field(default_factory=dict)
    placements: dict[int, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    # job -> the estimated start of the first reservation it held (known starts only)
    first_reservation: dict[int, float] = field(default_factory=dict)
    cycles: int = 0
    cycle_seconds: float = 0.0


def replay(
    jobs: list[TraceJob],
    nodes: list[NodeInfo],
    queues: list[QueueInfo],
    config: SchedulingPolicy,
    incremental: bool = True,
) -> ReplayResult:
    """Replay until every job has started or nothing more can happen; a job that never fits
    is left out of `starts`."""
    path: _Path = _Standing(nodes, queues, config) if incremental else _Full(nodes, queues, config)
    by_id = {j.id: j for j in jobs}
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    ends: list[tuple[float, int]] = []
    result = ReplayResult()
    waiting = 0
    next_arrival = 0
    while next_arrival < len(arrivals) or ends:
        now = arrivals[next_arrival].submit if next_arrival < len(arrivals) else ends[0][0]
        if ends and ends[0][0] < now:
            now = ends[0][0]
        while ends and ends[0][0] <= now:
            path.finish(heapq.heappop(ends)[1])
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now:
            path.submit(arrivals[next_arrival])
            next_arrival += 1
            waiting += 1
        if not waiting:
            continue
        tick = time.perf_counter()
        started = path.cycle(now, result)
        result.cycle_seconds += time.perf_counter() - tick
        result.cycles += 1
        for job_id, where in started.items():
            job = by_id[job_id]
            if len(where) != job.tasks:
                raise AssertionError(f"job {job_id}: the gang must start whole")
            result.starts[job_id] = now
            result.placements[job_id] = where
            waiting -= 1
            heapq.heappush(ends, (now + job.runtime, job_id))
    return result


def job_info(job: TraceJob, first_task_id: int) -> JobInfo:
    return JobInfo(
        id=job.id,
        name=f"trace-{job.id}",
        queue=job.queue,
        owner=job.owner,
        priority=job.priority,
        preemptible=False,
        min_available=job.tasks,
        created_at=job.submit,
        walltime=job.walltime,
        state="Pending",
        # (id, group, index, resources, node selector: positional, a quarter cheaper for
        # the one task per processor a replay makes)
        tasks=[
            TaskInfo(first_task_id + i, "main", i, job.resources, job.node_selector)
            for i in range(job.tasks)
        ],
    )


def _started(result: CycleResult) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
    started: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for bind in result.binds:
        started.setdefault(bind.job_id, []).append((bind.node, bind.devices))
    return started


class _Path:
    def submit(self, job: TraceJob) -> None:
        raise NotImplementedError

    def finish(self, job_id: int) -> None:
        raise NotImplementedError

    def cycle(
        self, now: float, result: ReplayResult
    ) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
        raise NotImplementedError


class _Standing(_Path):
    def __init__(self, nodes: list[NodeInfo], queues: list[QueueInfo], config: SchedulingPolicy):
        self.standing = StandingSession(nodes, queues, config)
        self.next_task_id = 1

    def submit(self, job: TraceJob) -> None:
        self.standing.submit(job_info(job, self.next_task_id))
        self.next_task_id += job.tasks

    def finish(self, job_id: int) -> None:
        self.standing.finish(job_id)

    def cycle(
        self, now: float, result: ReplayResult
    ) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
        cycle = self.standing.cycle(now)
        result.first_reservation = self.standing.session.reservation_starts
        return _started(cycle)


class _Full(_Path):
    """A fresh snapshot of every pending and running job at every cycle."""

    def __init__(self, nodes: list[NodeInfo], queues: list[QueueInfo], config: SchedulingPolicy):
        self.nodes, self.queues, self.config = nodes, queues, config
        self.pending: dict[int, TraceJob] = {}
        self.running: dict[int, tuple[TraceJob, float, list[tuple[str, tuple[int, ...]]]]] = {}

    def submit(self, job: TraceJob) -> None:
        self.pending[job.id] = job

    def finish(self, job_id: int) -> None:
        self.running.pop(job_id)

    def cycle(
        self, now: float, result: ReplayResult
    ) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
        infos = [job_info(j, j.id * 1000) for j in self.pending.values()]
        for job, started_at, where in self.running.values():
            info = job_info(job, job.id * 1000)
            info.state = "Running"
            for task, (node, devices) in zip(info.tasks, where, strict=True):
                task.state, task.node, task.devices, task.started_at = (
                    "Running", node, devices, started_at,
                )  # fmt: skip
            infos.append(info)
        cycle = run_cycle(Snapshot(now, self.nodes, self.queues, infos), self.config)
        for job_id, status in cycle.pending.items():
            if status.code == Code.RESERVED and status.estimated_start is not None:
                result.first_reservation.setdefault(job_id, status.estimated_start)
        started = _started(cycle)
        for job_id, where in started.items():
            self.running[job_id] = (self.pending.pop(job_id), now, where)
        return started
