"""Time the plan phase's core: queue positions and start estimates for a waiting backlog.

    python bench/plan.py                       # 1,000 pending jobs on 200 nodes x 8 GPUs
    python bench/plan.py --jobs 10000 --depth 500

The cluster and backlog are bench/cycle.py's (CPU-only, 1/2/4/8-GPU and multi-node gang jobs
over 4 queues, a few that never fit); with `--full` (the default) every GPU is first taken by
a running job with a walltime of up to 4 hours, so no job starts now and every one of them is
planned into the future: the worst case. Runs the cycle, then plans at `--depth` (the
default BERTH_PLAN_DEPTH, 500) and at the whole backlog. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cycle import NOW, build  # noqa: E402
from scheduler.core.cycle import run_cycle  # noqa: E402
from scheduler.core.model import JobInfo, SchedulingPolicy, Snapshot, TaskInfo  # noqa: E402
from scheduler.core.plan import DEFAULT_DEPTH, fingerprint, plan_starts  # noqa: E402
from scheduler.core.resources import Resources  # noqa: E402


def fill(snapshot: Snapshot, seed: int) -> None:
    """Put a running one-GPU job on every GPU nothing holds yet."""
    rng = random.Random(seed)
    held = {(t.node, d) for j in snapshot.jobs for t in j.tasks for d in t.devices}
    job_id = max(j.id for j in snapshot.jobs) + 1
    task_id = max(t.id for j in snapshot.jobs for t in j.tasks) + 1
    for node in snapshot.nodes:
        for device in node.devices:
            if (node.name, device.index) in held:
                continue
            task = TaskInfo(
                id=task_id, group="main", index=0, resources=Resources(4000, 32 << 30, 1),
                state="Running", node=node.name, devices=(device.index,),
                started_at=NOW - rng.randint(0, 3600),
            )  # fmt: skip
            snapshot.jobs.append(
                JobInfo(
                    id=job_id, name=f"fill-{job_id}", queue="q0", owner="fill", priority=0,
                    preemptible=False, min_available=1, created_at=NOW - 200_000,
                    walltime=float(rng.choice((3600, 7200, 14400))), state="Running",
                    tasks=[task],
                )
            )  # fmt: skip
            job_id += 1
            task_id += 1


def measure(nodes: int, gpus: int, jobs: int, depth: int, full: bool, seed: int) -> dict[str, Any]:
    snapshot = build(nodes, gpus, jobs, seed, 4)
    if full:
        fill(snapshot, seed)
    config = SchedulingPolicy()
    started = time.perf_counter()
    result = run_cycle(snapshot, config)
    cycle_s = time.perf_counter() - started
    row: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "pending_jobs": jobs,
        "full": full,
        "cycle_s": round(cycle_s, 4),
        "waiting_after_cycle": len(result.pending),
    }
    for name, limit in (("depth", depth), ("all", jobs)):
        started, cpu = time.perf_counter(), time.process_time()
        plan = plan_starts(snapshot, result, config, depth=limit)
        row[f"plan_{name}_s"] = round(time.perf_counter() - started, 4)
        # CPU time too: on a shared machine wall time includes waiting for a core.
        row[f"plan_{name}_cpu_s"] = round(time.process_time() - cpu, 4)
        row[f"plan_{name}_planned"] = plan.planned
        row[f"plan_{name}_estimated"] = sum(1 for t in plan.starts.values() if t is not None)
    started = time.perf_counter()
    fingerprint(snapshot, result, config)  # what a cycle with nothing new costs instead
    row["fingerprint_s"] = round(time.perf_counter() - started, 4)
    row["depth"] = depth
    row["positions"] = len(plan.positions)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH)
    parser.add_argument("--no-full", dest="full", action="store_false",
                        help="leave bench/cycle.py's two thirds of the GPUs free")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name in ("nodes", "gpus_per_node", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.depth < 0:
        parser.error("--depth must be at least 0")
    row = measure(args.nodes, args.gpus_per_node, args.jobs, args.depth, args.full, args.seed)
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
