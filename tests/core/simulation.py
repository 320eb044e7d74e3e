"""Run the core cycle forward in time: the check that start estimates (scheduler/core/plan.py)
agree with what the scheduler then does, shared by the plan tests."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plan import plan_starts
from tests.core.builders import NOW, snapshot


def simulate(
    nodes: list[NodeInfo],
    jobs: list[JobInfo],
    config: SchedulingPolicy | None = None,
    queues: list[QueueInfo] | None = None,
) -> dict[int, float]:
    """Run cycles at every moment something ends or is expected to start; tasks end exactly
    at their walltime. Returns when each job was bound."""
    now, bound_at = NOW, dict[int, float]()
    for _ in range(50):
        alive = [j for j in jobs if not _ended(j, now)]
        snap = snapshot(nodes, alive, queues, now=now)
        result = run_cycle(snap, config)
        plan = plan_starts(snap, result, config)
        jobs = [_apply(j, result, now) for j in alive]
        for b in result.binds:
            bound_at.setdefault(b.job_id, now)
        moments = [_end(j) for j in jobs if j.state == "Running" and j.walltime]
        moments += [t for t in plan.starts.values() if t is not None]
        later = [t for t in moments if t > now]
        if not later:
            return bound_at
        now = min(later)
    raise AssertionError("the simulation did not settle")


def _end(j: JobInfo) -> float:
    return max(t.started_at or 0 for t in j.tasks) + (j.walltime or 0)


def _ended(j: JobInfo, now: float) -> bool:
    return j.state == "Running" and j.walltime is not None and _end(j) <= now


def _apply(j: JobInfo, result: CycleResult, now: float) -> JobInfo:
    binds = {b.task_id: b for b in result.binds if b.job_id == j.id}
    if not binds:
        return j
    tasks = [
        replace(t, state="Running", node=binds[t.id].node, devices=binds[t.id].devices,
                started_at=now) if t.id in binds else t
        for t in j.tasks
    ]  # fmt: skip
    return replace(j, state="Running", tasks=tasks)
