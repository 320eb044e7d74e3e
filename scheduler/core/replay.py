"""Discrete-event replay of a job trace through the core: at every arrival and completion
the core runs a cycle and its binds start jobs at that time.

Two paths decide the same: `incremental=True` keeps one standing session and tells it what
arrived and finished; `incremental=False` builds a full snapshot and calls `run_cycle` at
every event, as a deployment does (the reference the fast path is tested against).

With `predictions=True` each job is planned by its EASY++ runtime prediction
(scheduler/core/predict.py: its owner's last two finished run times, capped by its walltime)
instead of its walltime; it still runs its own run time (a trace's run time is already capped
by the walltime it was killed at). With `estimates=True` every job gets a start estimate at
submission (`ReplayResult.estimates`, see `submission_estimate`).

With `fair_share` (a `FairShare`) each owner's usage is what their jobs that finished so far
in simulated time used, resource-weighted and decayed as the product counts it
(`scheduler/core/priority.py`, as `scheduler/cycle/fairshare.py` uses it), put on the session
before a cycle as the product's loop puts it on its snapshot; the policy's
`priority_weights` order the pending jobs by the same plugin as the scheduler's cycle.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.core import predict
from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.priority import DAY, HORIZON_HALF_LIVES, decayed, weighted_usage
from scheduler.core.resources import Resources
from scheduler.core.standing import StandingSession
from scheduler.core.status import Code
from scheduler.core.timeline import INF, Timeline


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


@dataclass(frozen=True)
class FairShare:
    """Per-user fair share in a replay, with the product's defaults: usage halved every
    `half_life` seconds (BERTH_FAIRSHARE_HALF_LIFE; 0: never), core-seconds and GPU-seconds
    weighted by `cpu_weight` and `gpu_weight` (BERTH_FAIRSHARE_CPU_WEIGHT, _GPU_WEIGHT), every
    user's share equal (or `shares`, scaled so a user without one has 1), usage read again
    at most every `refresh` simulated seconds (BERTH_FAIRSHARE_REFRESH_SECONDS) and only
    after a job finished. The factor weights are the policy's `priority_weights`."""

    half_life: float = 7 * DAY
    cpu_weight: float = 1.0
    gpu_weight: float = 10.0
    refresh: float = 60.0
    shares: tuple[tuple[str, float], ...] = ()


class Usage:
    """Each owner's decayed usage of the jobs finished so far, kept as worth at `epoch`: a
    job's usage over 2^-((end - epoch) / half_life), so an end touches one owner and reading
    at `now` scales every owner alike (the decay of usage at its end, to `now`). Owners whose
    last job ended more than ten half-lives ago drop out, as the product's records do."""

    REBASE = 64  # half-lives: past this the epoch moves up, before the floats overflow

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.epoch = 0.0
        self.held: dict[str, float] = {}
        self.last_end: dict[str, float] = {}

    def finished(self, job: TraceJob, end: float) -> None:
        half_life = self.fair.half_life
        if not self.held:
            self.epoch = end
        elif half_life > 0 and end - self.epoch > self.REBASE * half_life:
            self.held = self.at(end)
            self.epoch = end
        cpu_seconds = job.tasks * job.resources.cpu / 1000 * job.runtime
        gpu_seconds = job.tasks * job.resources.gpu * job.runtime
        used = weighted_usage(cpu_seconds, gpu_seconds, self.fair.cpu_weight, self.fair.gpu_weight)
        worth = used / decayed(1.0, end - self.epoch, half_life)
        self.held[job.owner] = self.held.get(job.owner, 0.0) + worth
        self.last_end[job.owner] = end

    def at(self, now: float) -> dict[str, float]:
        """owner -> usage as it counts at `now`."""
        half_life = self.fair.half_life
        scale = decayed(1.0, now - self.epoch, half_life)
        if half_life <= 0:
            return dict(self.held)
        horizon = now - HORIZON_HALF_LIVES * half_life
        for owner in [o for o, end in self.last_end.items() if end < horizon]:
            del self.held[owner], self.last_end[owner]
        return {owner: worth * scale for owner, worth in self.held.items()}


@dataclass
class ReplayResult:
    starts: dict[int, float] = field(default_factory=dict)
    placements: dict[int, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    # job -> the estimated start of the first reservation it held (known starts only)
    first_reservation: dict[int, float] = field(default_factory=dict)
    cycles: int = 0
    cycle_seconds: float = 0.0
    # job -> the runtime it was planned by (its prediction; with predictions on only)
    predicted: dict[int, float | None] = field(default_factory=dict)
    # job -> its start estimate at submission (with estimates on; unknown ones left out)
    estimates: dict[int, float] = field(default_factory=dict)


def replay(
    jobs: list[TraceJob],
    nodes: list[NodeInfo],
    queues: list[QueueInfo],
    config: SchedulingPolicy,
    incremental: bool = True,
    predictions: bool = False,
    estimates: bool = False,
    fair_share: FairShare | None = None,
) -> ReplayResult:
    """Replay until every job has started or nothing more can happen; a job that never fits
    is left out of `starts`."""
    path: _Path = _Standing(nodes, queues, config) if incremental else _Full(nodes, queues, config)
    run = _Run(jobs, path, config, predictions, estimates, nodes)
    run.usage = Usage(fair_share) if fair_share is not None else None
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    next_arrival = 0
    while next_arrival < len(arrivals) or run.ends:
        now = arrivals[next_arrival].submit if next_arrival < len(arrivals) else run.ends[0][0]
        if run.ends and run.ends[0][0] < now:
            now = run.ends[0][0]
        while run.ends and run.ends[0][0] <= now:
            run.finish(*heapq.heappop(run.ends))
        arrived = []
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now:
            arrived.append(arrivals[next_arrival])
            run.submit(arrivals[next_arrival])
            next_arrival += 1
        if run.pending:
            run.cycle(now)
        if estimates and arrived:
            run.estimate(now, arrived)
    return run.result


class _Run:
    """One replay's state: what waits, what runs and until when, the owners' histories."""

    def __init__(
        self,
        jobs: list[TraceJob],
        path: _Path,
        config: SchedulingPolicy,
        predictions: bool,
        estimates: bool,
        nodes: list[NodeInfo],
    ) -> None:
        self.by_id = {j.id: j for j in jobs}
        self.path, self.config, self.predictions = path, config, predictions
        self.history = predict.History()
        self.result = ReplayResult()
        self.ends: list[tuple[float, int]] = []
        self.pending: dict[int, TraceJob] = {}  # in arrival order
        self.running: dict[int, float] = {}  # job -> its start
        self.capacity = sum(n.allocatable.cpu for n in nodes if n.state == "Ready")
        self.usage: Usage | None = None  # with fair share
        self.usage_read = -INF  # when the usage was last put on the session
        self.usage_changed = False  # a job finished since

    def submit(self, job: TraceJob) -> None:
        predicted = self.history.predict(job.owner, job.walltime) if self.predictions else None
        if self.predictions:
            self.result.predicted[job.id] = predicted
        self.pending[job.id] = job
        self.path.submit(job, predicted)

    def finish(self, at: float, job_id: int) -> None:
        job = self.by_id[job_id]
        self.running.pop(job_id)
        self.history.finished(job.owner, job.runtime)
        if self.usage is not None:
            self.usage.finished(job, at)
            self.usage_changed = True
        self.path.finish(job_id)

    def read_usage(self, now: float) -> None:
        """Put the owners' usage on the session, when a job finished since it was last put
        there at least `refresh` seconds ago (decay alone moves no factor: it scales every
        owner's usage alike, and the factor reads usage over everyone's)."""
        usage = self.usage
        if usage is None or not self.usage_changed or now - self.usage_read < usage.fair.refresh:
            return
        self.path.set_usage(usage.at(now), dict(usage.fair.shares))
        self.usage_read, self.usage_changed = now, False

    def cycle(self, now: float) -> None:
        result = self.result
        tick = time.perf_counter()
        self.read_usage(now)
        started = self.path.cycle(now, result)
        result.cycle_seconds += time.perf_counter() - tick
        result.cycles += 1
        for job_id, where in started.items():
            job = self.by_id[job_id]
            if len(where) != job.tasks:
                raise AssertionError(f"job {job_id}: the gang must start whole")
            result.starts[job_id] = now
            result.placements[job_id] = where
            del self.pending[job_id]
            self.running[job_id] = now
            heapq.heappush(self.ends, (now + job.runtime, job_id))

    def estimate(self, now: float, arrived: list[TraceJob]) -> None:
        """The start estimates of the jobs that just arrived (see `submission_estimate`)."""
        correction = self.config.prediction_correction
        releases = []
        for job_id, started in self.running.items():
            job = self.by_id[job_id]
            info = _Planned(job.walltime, self.result.predicted.get(job_id))
            end = predict.end(info, started, now, correction)
            releases.append((INF if end is None else max(now, end), job.tasks * job.resources.cpu))
        waiting = self.pending.values() if self.usage is None else self.path.order(self.pending)
        ahead = [(j, self.result.predicted.get(j.id)) for j in waiting]
        found = submission_estimate(now, self.capacity, releases, ahead, {j.id for j in arrived})
        for job in arrived:
            if job.id in self.result.starts:
                self.result.estimates[job.id] = self.result.starts[job.id]
            elif job.id in found:
                self.result.estimates[job.id] = found[job.id]


@dataclass
class _Planned:
    walltime: float | None
    predicted: float | None


def submission_estimate(
    now: float,
    capacity: int,
    releases: Iterable[tuple[float, int]],
    pending: list[tuple[TraceJob, float | None]],
    wanted: set[int],
) -> dict[int, float]:
    """Start estimates as a conservative plan gives them (as scheduler/core/plan.py does,
    on the cluster's processors in total rather than node by node: exact where every task
    takes whole nodes, as in the SWF replays): running jobs give back their processors at
    their planned ends (walltime, or prediction), and the pending jobs, in queue order, each
    take the earliest time their processors are free for their planned run time. Only
    `wanted` jobs' estimates are returned; the plan stops after the last of them."""
    used = sum(cpu for _, cpu in releases)
    line = Timeline(now, (capacity - used, 0, 0), [(at, (cpu, 0, 0)) for at, cpu in releases])
    found: dict[int, float] = {}
    left = len(wanted)
    for job, predicted in pending:
        ran = predict.runtime(_Planned(job.walltime, predicted))
        duration = INF if ran is None else ran
        need = (job.tasks * job.resources.cpu, 0, 0)
        start = line.earliest(need, duration, now, INF)
        if start is None:
            continue
        line.hold(start, start + duration, need)
        if job.id in wanted:
            found[job.id] = start
            left -= 1
            if left == 0:
                break
    return found


def job_info(job: TraceJob, first_task_id: int, predicted: float | None = None) -> JobInfo:
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
        predicted=predicted,
    )


def _started(result: CycleResult) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
    started: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for bind in result.binds:
        started.setdefault(bind.job_id, []).append((bind.node, bind.devices))
    return started


class _Path:
    def submit(self, job: TraceJob, predicted: float | None) -> None:
        raise NotImplementedError

    def set_usage(self, usage: dict[str, float], shares: dict[str, float]) -> None:
        raise NotImplementedError

    def order(self, pending: dict[int, TraceJob]) -> list[TraceJob]:
        """The pending jobs in the order the last cycle left them in (arrival order here)."""
        return list(pending.values())

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

    def submit(self, job: TraceJob, predicted: float | None) -> None:
        self.standing.submit(job_info(job, self.next_task_id, predicted))
        self.next_task_id += job.tasks

    def finish(self, job_id: int) -> None:
        self.standing.finish(job_id)

    def set_usage(self, usage: dict[str, float], shares: dict[str, float]) -> None:
        self.standing.set_usage(usage, shares)

    def order(self, pending: dict[int, TraceJob]) -> list[TraceJob]:
        """The queues' jobs in their order (by priority, with factors), then any others."""
        queued = [j.id for q in self.standing.session.queues.values() for j in q.jobs]
        ordered = [pending[i] for i in queued if i in pending]
        seen = set(queued)
        return ordered + [j for i, j in pending.items() if i not in seen]

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
        self.predicted: dict[int, float | None] = {}
        self.usage: dict[str, float] = {}
        self.shares: dict[str, float] = {}

    def submit(self, job: TraceJob, predicted: float | None) -> None:
        self.pending[job.id] = job
        self.predicted[job.id] = predicted

    def set_usage(self, usage: dict[str, float], shares: dict[str, float]) -> None:
        self.usage, self.shares = usage, shares

    def finish(self, job_id: int) -> None:
        self.running.pop(job_id)
        self.predicted.pop(job_id)

    def cycle(
        self, now: float, result: ReplayResult
    ) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
        infos = [job_info(j, j.id * 1000, self.predicted[j.id]) for j in self.pending.values()]
        for job, started_at, where in self.running.values():
            info = job_info(job, job.id * 1000, self.predicted[job.id])
            info.state = "Running"
            for task, (node, devices) in zip(info.tasks, where, strict=True):
                task.state, task.node, task.devices, task.started_at = (
                    "Running", node, devices, started_at,
                )  # fmt: skip
            infos.append(info)
        snapshot = Snapshot(now, self.nodes, self.queues, infos, self.usage, self.shares)
        cycle = run_cycle(snapshot, self.config)
        for job_id, status in cycle.pending.items():
            if status.code == Code.RESERVED and status.estimated_start is not None:
                result.first_reservation.setdefault(job_id, status.estimated_start)
        started = _started(cycle)
        for job_id, where in started.items():
            self.running[job_id] = (self.pending.pop(job_id), now, where)
        return started
