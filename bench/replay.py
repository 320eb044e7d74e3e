"""Discrete-event replay of a real HPC log through Berth's scheduler core.

The KTH IBM SP2 log (Parallel Workloads Archive, cleaned; 28,476 jobs, 100 nodes) is replayed
on 100 single-processor nodes: each job is a gang of `req_procs` one-cpu tasks that must all
start together, its requested time is its walltime and its actual run time how long it runs
(a job that ran past its request is killed at the walltime, as Berth would). At every arrival
and completion the core runs a cycle (`scheduler.core.replay`): by default on one standing
session told what arrived and finished; with `--full-cycles` on a full snapshot through
`run_cycle`, as before (the same decisions, much slower).

    python bench/replay.py --jobs 10000 --policies fcfs,easy,default
    python bench/replay.py --policies easy --accasim-python /tmp/accasim/bin/python

Prints one JSON object: per policy the mean wait, mean bounded slowdown (tau = 10 s),
utilisation, makespan, the wall and CPU time the replay took, and reservation protection:
how many jobs that held the reservation started later than its first estimated start, and
the worst wait of jobs needing at least 50 processors. With `--accasim-python` (an
interpreter with AccaSim installed, kept out of Berth's venv) AccaSim's EASY runs the same
jobs in the same run (`bench/accasim_easy.py`) and the JSON gives the time ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.model import NodeInfo, QueueInfo, SchedulingPolicy  # noqa: E402
from scheduler.core.replay import TraceJob, replay  # noqa: E402
from scheduler.core.resources import Resources  # noqa: E402

TRACE = Path("/work/shared/bench/traces/kth_sp2_1996_cln_jobs.csv")
NODES = 100
TAU = 10.0
WIDE = 50  # processors: the jobs whose worst wait is reported
CPU = Resources(cpu=1000, memory=1 << 30)
POLICIES = {
    "fcfs": SchedulingPolicy.fcfs,
    "easy": SchedulingPolicy.easy,
    "default": SchedulingPolicy,
}


def load(path: Path, limit: int | None) -> tuple[list[TraceJob], int, list[list[str]]]:
    """The first `limit` rows as trace jobs, how many were skipped, and the rows kept (for
    AccaSim's SWF)."""
    jobs: list[TraceJob] = []
    rows: list[list[str]] = []
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
            runtime = min(run, walltime) if walltime > 0 else run
            jobs.append(
                TraceJob(
                    id=int(row["job_id"]),
                    submit=float(row["submit_time"]),
                    tasks=procs,
                    resources=CPU,
                    runtime=runtime,
                    walltime=walltime,
                    owner=row["user_id"],
                )
            )
            rows.append(_swf_row(row, procs, walltime, runtime))
    return jobs, skipped, rows


def run(jobs: list[TraceJob], policy: str, full_cycles: bool) -> dict[str, Any]:
    nodes = [NodeInfo(name=f"n{i:03d}", allocatable=CPU) for i in range(NODES)]
    started, cpu_started = time.perf_counter(), time.process_time()
    result = replay(jobs, nodes, [QueueInfo(name="default")], POLICIES[policy](), not full_cycles)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    never = [j.id for j in jobs if j.id not in result.starts]
    if never:
        raise RuntimeError(f"{len(never)} jobs never started under {policy}")
    starts = result.starts
    first_submit = min(j.submit for j in jobs)
    last_end = max(starts[j.id] + j.runtime for j in jobs)
    waits = [starts[j.id] - j.submit for j in jobs]
    slowdowns = [
        max(1.0, (starts[j.id] - j.submit + j.runtime) / max(j.runtime, TAU)) for j in jobs
    ]
    work = sum(j.runtime * j.tasks for j in jobs)
    late = [i for i, promised in result.first_reservation.items() if starts[i] > promised]
    wide = [starts[j.id] - j.submit for j in jobs if j.tasks >= WIDE]
    return {
        "policy": policy,
        "path": "full cycles (run_cycle on a snapshot)" if full_cycles else "standing session",
        "mean_wait_s": round(sum(waits) / len(jobs), 1),
        "median_wait_s": round(sorted(waits)[len(waits) // 2], 1),
        "mean_bounded_slowdown": round(sum(slowdowns) / len(jobs), 2),
        "utilisation": round(work / (NODES * (last_end - first_submit)), 4),
        "makespan_s": round(last_end - first_submit, 1),
        "cycles": result.cycles,
        "mean_cycle_ms": round(1000 * result.cycle_seconds / max(result.cycles, 1), 3),
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "reserved_jobs": len(result.first_reservation),
        "reserved_jobs_started_late": len(late),
        "worst_late_start_s": round(
            max((starts[i] - result.first_reservation[i] for i in late), default=0.0), 1
        ),
        f"jobs_with_{WIDE}_or_more_procs": len(wide),
        f"worst_wait_{WIDE}_or_more_procs_s": round(max(wide, default=0.0), 1),
    }


def _swf_row(row: dict[str, str], procs: int, walltime: float, runtime: float) -> list[str]:
    """One job in the Standard Workload Format, as Berth replays it: run time capped at the
    walltime, one processor each of `procs`, a nominal memory request (AccaSim divides by
    every requested resource)."""
    return [
        row["job_id"], row["submit_time"], "-1", str(int(runtime)), str(procs), "-1", "-1",
        str(procs), str(int(walltime)), "1", "1", row["user_id"], row["group_id"],
        "-1", "-1", "-1", "-1", "-1",
    ]  # fmt: skip


def run_accasim(python: str, rows: list[list[str]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        swf = Path(work) / "trace.swf"
        swf.write_text("".join(" ".join(r) + "\n" for r in rows))
        driver = ROOT / "bench" / "accasim_easy.py"
        done = subprocess.run(
            [python, str(driver), str(swf), "--nodes", str(NODES)],
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
        )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    last: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs (default: all)")
    parser.add_argument("--policies", default="fcfs,easy,default")
    parser.add_argument(
        "--full-cycles",
        action="store_true",
        help="run_cycle on a full snapshot at every event (the reference path; slow)",
    )
    parser.add_argument(
        "--accasim-python",
        metavar="PATH",
        help="an interpreter with AccaSim installed: run its EASY on the same jobs",
    )
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)} (choose fcfs, easy, default)")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not args.trace.exists():
        parser.error(f"--trace: {args.trace} not found")
    if args.accasim_python and not Path(args.accasim_python).exists():
        parser.error(f"--accasim-python: {args.accasim_python} not found")

    jobs, skipped, rows = load(args.trace, args.jobs)
    results = [run(jobs, policy, args.full_cycles) for policy in policies]
    print(json.dumps(summarise(args, jobs, skipped, rows, results), indent=1))


def summarise(
    args: argparse.Namespace,
    jobs: list[TraceJob],
    skipped: int,
    rows: list[list[str]],
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "trace": args.trace.name,
        "jobs": len(jobs),
        "skipped": skipped,
        "nodes": NODES,
        "results": results,
    }
    by_policy = {r["policy"]: r for r in results}
    fcfs, easy = by_policy.get("fcfs"), by_policy.get("easy")
    if fcfs and easy:
        summary["easy_vs_fcfs"] = {
            "wait_reduction": round(1 - easy["mean_wait_s"] / fcfs["mean_wait_s"], 4),
            "slowdown_reduction": round(
                1 - easy["mean_bounded_slowdown"] / fcfs["mean_bounded_slowdown"], 4
            ),
        }
    if args.accasim_python:
        accasim = run_accasim(args.accasim_python, rows)
        summary["accasim_easy"] = accasim
        if easy and "wall_seconds" in accasim:
            summary["berth_vs_accasim_easy"] = {
                "wall_ratio": round(easy["wall_seconds"] / accasim["wall_seconds"], 3),
                "cpu_ratio": round(easy["cpu_seconds"] / accasim["cpu_seconds"], 3),
            }
    return summary


if __name__ == "__main__":
    main()
