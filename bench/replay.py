"""Discrete-event replay of a real HPC log through Berth's scheduler core.

The KTH IBM SP2 log (Parallel Workloads Archive, cleaned; 28,476 jobs, 100 nodes) is replayed
on 100 single-processor nodes: each job is a gang of `req_procs` one-cpu tasks that must all
start together, its requested time is its walltime and its actual run time how long it runs
(a job that ran past its request is killed at the walltime, as Berth would). At every arrival
and completion the core runs a full cycle on a snapshot and its binds start jobs at that time.

    python bench/replay.py --jobs 10000 --policies fcfs,easy,default

Prints one JSON object: per policy the mean wait, mean bounded slowdown (tau = 10 s),
utilisation, makespan, and the wall time the replay took.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.cycle import run_cycle  # noqa: E402
from scheduler.core.model import (  # noqa: E402
    JobInfo,
    NodeInfo,
    QueueInfo,
    SchedulingPolicy,
    Snapshot,
    TaskInfo,
)
from scheduler.core.resources import Resources  # noqa: E402

TRACE = ROOT.parent / "shared" / "bench" / "traces" / "kth_sp2_1996_cln_jobs.csv"
NODES = 100
TAU = 10.0
CPU = Resources(cpu=1000, memory=1 << 30)


@dataclass
class TraceJob:
    id: int
    submit: float
    procs: int
    walltime: float
    runtime: float
    user: int
    start: float | None = None
    end: float | None = None


def load(path: Path, limit: int | None) -> tuple[list[TraceJob], int]:
    jobs: list[TraceJob] = []
    skipped = 0
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if limit is not None and len(jobs) + skipped >= limit:
                break
            procs = int(row["req_procs"]) if int(row["req_procs"]) > 0 else int(row["alloc_procs"])
            if procs <= 0 or procs > NODES:
                skipped += 1  # one job in the log has no processor count at all
                continue
            walltime = float(row["req_time"])
            run = max(0.0, float(row["run_time"]))
            jobs.append(
                TraceJob(
                    id=int(row["job_id"]),
                    submit=float(row["submit_time"]),
                    procs=procs,
                    walltime=walltime,
                    runtime=min(run, walltime) if walltime > 0 else run,
                    user=int(row["user_id"]),
                )
            )
    return jobs, skipped


def config_for(policy: str) -> SchedulingPolicy:
    presets = {"fcfs": SchedulingPolicy.fcfs, "easy": SchedulingPolicy.easy}
    if policy == "default":
        return SchedulingPolicy()
    return presets[policy]()


def replay(jobs: list[TraceJob], policy: str) -> dict[str, Any]:
    config = config_for(policy)
    nodes = [
        NodeInfo(name=f"n{i:03d}", allocatable=CPU, labels={}, devices=[]) for i in range(NODES)
    ]
    queues = [QueueInfo(name="default")]
    by_id = {j.id: j for j in jobs}
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    pending: dict[int, TraceJob] = {}
    running: dict[int, tuple[TraceJob, list[str]]] = {}
    ends: list[tuple[float, int]] = []  # heap of (end time, job id)
    next_arrival = 0
    cycles = 0
    cycle_seconds = 0.0
    started = time.perf_counter()

    while next_arrival < len(arrivals) or ends or pending:
        candidates = [arrivals[next_arrival].submit] if next_arrival < len(arrivals) else []
        if ends:
            candidates.append(ends[0][0])
        if not candidates:
            raise RuntimeError(f"{len(pending)} jobs can never start under {policy}")
        now = min(candidates)
        while ends and ends[0][0] <= now:
            _, job_id = heapq.heappop(ends)
            running.pop(job_id)
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now:
            job = arrivals[next_arrival]
            pending[job.id] = job
            next_arrival += 1
        if not pending:
            continue

        snapshot = Snapshot(now=now, nodes=nodes, queues=queues, jobs=_jobs(pending, running))
        tick = time.perf_counter()
        result = run_cycle(snapshot, config)
        cycle_seconds += time.perf_counter() - tick
        cycles += 1
        placed: dict[int, list[str]] = {}
        for bind in result.binds:
            placed.setdefault(bind.job_id, []).append(bind.node)
        for job_id, where in placed.items():
            job = by_id[job_id]
            assert len(where) == job.procs, "the gang must start whole"
            job.start = now
            job.end = now + job.runtime
            pending.pop(job_id)
            running[job_id] = (job, where)
            heapq.heappush(ends, (job.end, job_id))

    wall = time.perf_counter() - started
    first_submit = min(j.submit for j in jobs)
    last_end = max(j.end or 0.0 for j in jobs)
    waits = [(j.start or 0.0) - j.submit for j in jobs]
    slowdowns = [
        max(1.0, ((j.start or 0.0) - j.submit + j.runtime) / max(j.runtime, TAU)) for j in jobs
    ]
    work = sum(j.runtime * j.procs for j in jobs)
    return {
        "policy": policy,
        "mean_wait_s": round(sum(waits) / len(jobs), 1),
        "median_wait_s": round(sorted(waits)[len(waits) // 2], 1),
        "mean_bounded_slowdown": round(sum(slowdowns) / len(jobs), 2),
        "utilisation": round(work / (NODES * (last_end - first_submit)), 4),
        "makespan_s": round(last_end - first_submit, 1),
        "cycles": cycles,
        "mean_cycle_ms": round(1000 * cycle_seconds / max(cycles, 1), 3),
        "wall_seconds": round(wall, 2),
    }


def _jobs(
    pending: dict[int, TraceJob], running: dict[int, tuple[TraceJob, list[str]]]
) -> list[JobInfo]:
    infos = []
    for job in pending.values():
        infos.append(_info(job, "Pending", [None] * job.procs))
    for job, where in running.values():
        infos.append(_info(job, "Running", where))
    return infos


def _info(job: TraceJob, state: str, where: list[str] | list[None]) -> JobInfo:
    return JobInfo(
        id=job.id,
        name=f"kth-{job.id}",
        queue="default",
        owner=str(job.user),
        priority=0,
        preemptible=False,
        min_available=job.procs,
        created_at=job.submit,
        walltime=job.walltime,
        state=state,
        tasks=[
            TaskInfo(
                id=job.id * 1000 + i,
                group="main",
                index=i,
                resources=CPU,
                node_selector={},
                state="Running" if node else "Pending",
                node=node,
                started_at=job.start,
            )
            for i, node in enumerate(where)
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs (default: all)")
    parser.add_argument("--policies", default="fcfs,easy,default")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in ("fcfs", "easy", "default")]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)} (choose fcfs, easy, default)")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not args.trace.exists():
        parser.error(f"--trace: {args.trace} not found")

    results = []
    for policy in policies:
        jobs, skipped = load(args.trace, args.jobs)
        results.append(replay(jobs, policy))
    fcfs = next((r for r in results if r["policy"] == "fcfs"), None)
    easy = next((r for r in results if r["policy"] == "easy"), None)
    summary: dict[str, Any] = {
        "trace": args.trace.name,
        "jobs": len(jobs),
        "skipped": skipped,
        "nodes": NODES,
        "results": results,
    }
    if fcfs and easy:
        summary["easy_vs_fcfs"] = {
            "wait_reduction": round(1 - easy["mean_wait_s"] / fcfs["mean_wait_s"], 4),
            "slowdown_reduction": round(
                1 - easy["mean_bounded_slowdown"] / fcfs["mean_bounded_slowdown"], 4
            ),
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
