"""Discrete-event replay of a real HPC log through Berth's scheduler core.

Reads the Standard Workload Format directly (`bench/swf.py`; `.swf` or `.swf.gz`, e.g. the
SDSC Blue Horizon log: 144 nodes of 8 processors by its header) or the KTH SP2 log as CSV
(the same 18 fields renamed; 100 single-processor nodes). Each job is a gang of whole nodes
(ceil(processors / processors per node) tasks, each taking one node) that must all start
together; its requested time is its walltime and its actual run time how long it runs (a job
that ran past its request is killed at the walltime, as Berth would). At every arrival and
completion the core runs a cycle (`scheduler.core.replay`): by default on one standing
session told what arrived and finished; with `--full-cycles` on a full snapshot through
`run_cycle`, as before (the same decisions, much slower).

    python bench/replay.py --jobs 10000 --policies fcfs,easy,default
    python bench/replay.py --policies easy,easy++              # EASY vs EASY++ on KTH
    python bench/replay.py --trace ../shared/bench/traces/SDSC-BLUE-2000-4.2-cln.swf.gz \
        --jobs 20000 --policies easy,easy++
    python bench/replay.py --policies easy --accasim-python /tmp/accasim/bin/python
    python bench/replay.py --policies easy,easy++ --fair-share both  # fair share off and on

Policies: fcfs, easy, default (Berth's default actions), easy++ (EASY planned by runtime
predictions, issue #21: each user's last two run times, capped by the walltime, raised to
the walltime when outlived; `--correction stepwise` raises them stepwise).

`--fair-share on` (or `both`: off, then on) orders the pending jobs by the multifactor
priority the scheduler's cycle uses (`scheduler.core.priority`), each user's usage being what
their jobs finished so far in simulated time used (processor-seconds, decayed with
`--half-life`); the weights and the half-life default to the product's settings
(BERTH_PRIORITY_WEIGHT_*, BERTH_FAIRSHARE_*). A result with it on is named `<policy> fs`.

Prints one JSON object: per policy the mean wait, mean bounded slowdown (bsld, tau = 10 s),
per user (each user's mean bsld: the worst-off and the median user's, and Jain's fairness
index over users), utilisation, makespan, the wall and CPU time the replay took, reservation
protection (jobs that held the reservation and started later than its first estimated
start; the worst wait of jobs needing at least 50 processors), the accuracy of the runtime
each job was planned by (min/max of it and the run time) and of start estimates made at
submission (for jobs that waited: mean |estimate - start|). With `--accasim-python` (an
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
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import swf  # noqa: E402
from scheduler.core.model import NodeInfo, QueueInfo, SchedulingPolicy  # noqa: E402
from scheduler.core.priority import PriorityWeights  # noqa: E402
from scheduler.core.replay import FairShare, ReplayResult, TraceJob, replay  # noqa: E402
from scheduler.core.resources import Resources  # noqa: E402

TRACES = ROOT.parent / "shared" / "bench" / "traces"  # ../shared/... from the checkout
TRACE = TRACES / "kth_sp2_1996_cln_jobs.csv"
KTH_NODES = 100
TAU = 10.0
WIDE = 50  # processors: the jobs whose worst wait is reported
CPU_MILLI = 1000  # per processor
MEMORY = 1 << 30  # per node, nominal
POLICIES = {
    "fcfs": (SchedulingPolicy.fcfs, False),
    "easy": (SchedulingPolicy.easy, False),
    "default": (SchedulingPolicy, False),
    "easy++": (SchedulingPolicy.easy, True),
}
CSV_FIELDS = (
    "job_id", "submit_time", "wait_time", "run_time", "alloc_procs", "req_procs", "req_time",
    "status", "user_id", "group_id", "queue_id",
)  # fmt: skip


def read_log(path: Path, limit: int | None) -> swf.SwfLog:
    """SWF (plain or gzipped) or the KTH CSV (its header row names the SWF fields)."""
    if path.suffix != ".csv":
        return swf.read(path, limit)
    log = swf.SwfLog(max_nodes=KTH_NODES, max_procs=KTH_NODES)
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if limit is not None and len(log.jobs) >= limit:
                break
            v = [float(row[f]) for f in CSV_FIELDS]
            log.jobs.append(
                swf.SwfJob(
                    int(v[0]),
                    v[1],
                    v[2],
                    v[3],
                    int(v[4]),
                    int(v[5]),
                    v[6],
                    int(v[7]),
                    int(v[8]),
                    int(v[9]),
                    int(v[10]),
                )  # fmt: skip
            )
    return log


def load(log: swf.SwfLog) -> tuple[list[TraceJob], list[swf.Replayed], dict[str, int], int]:
    """Trace jobs on the log's machine, the SWF jobs kept, the counts left out by reason,
    and the number of nodes."""
    nodes = log.max_nodes or log.max_procs or KTH_NODES
    kept, left_out = swf.replayed(log, nodes)
    per_node = Resources(cpu=CPU_MILLI * log.procs_per_node, memory=MEMORY)
    jobs = [
        TraceJob(
            id=r.job.id,
            submit=r.job.submit,
            tasks=r.tasks,
            resources=per_node,
            runtime=r.runtime,
            walltime=r.walltime,
            owner=str(r.job.user) if r.job.user >= 0 else "",
        )
        for r in kept
    ]
    return jobs, kept, dict(left_out), nodes


def fair_share(args: argparse.Namespace) -> tuple[PriorityWeights, FairShare]:
    """The factor weights and the fair-share usage of `--fair-share on`."""
    weights = PriorityWeights(
        age=args.weight_age, fair_share=args.weight_fairshare, priority=args.weight_priority,
        max_age=args.max_age,
    )  # fmt: skip
    usage = FairShare(
        half_life=args.half_life, cpu_weight=args.cpu_weight, gpu_weight=args.gpu_weight,
        refresh=args.refresh,
    )  # fmt: skip
    return weights, usage


def run(
    jobs: list[TraceJob],
    nodes: int,
    per_node: Resources,
    policy: str,
    args: argparse.Namespace,
    fair: bool = False,
) -> dict[str, Any]:
    make, predictions = POLICIES[policy]
    config = make()
    weights, usage = fair_share(args) if fair else (PriorityWeights(), None)
    correction = args.correction if predictions else config.prediction_correction
    config = SchedulingPolicy(
        actions=config.actions, prediction_correction=correction, priority_weights=weights
    )
    cluster = [NodeInfo(name=f"n{i:03d}", allocatable=per_node) for i in range(nodes)]
    started, cpu_started = time.perf_counter(), time.process_time()
    result = replay(
        jobs, cluster, [QueueInfo(name="default")], config, not args.full_cycles,
        predictions=predictions, estimates=not args.no_estimates, fair_share=usage,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    never = [j.id for j in jobs if j.id not in result.starts]
    if never:
        raise RuntimeError(f"{len(never)} jobs never started under {policy}")
    out: dict[str, Any] = {
        "policy": policy + (" fs" if fair else ""),
        "path": "full cycles (run_cycle on a snapshot)" if args.full_cycles else "standing session",
    }
    if predictions:
        out["prediction_correction"] = args.correction
    if usage is not None:
        out["fair_share"] = {
            "weights": vars(weights),
            "half_life_s": usage.half_life,
            "refresh_s": usage.refresh,
        }
    out |= outcome(jobs, result, nodes * per_node.cpu // CPU_MILLI)
    out |= {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2)}
    return out


def outcome(jobs: list[TraceJob], result: ReplayResult, procs: int) -> dict[str, Any]:
    """Waits, slowdowns (overall and per user), utilisation, reservations, accuracies."""
    starts = result.starts
    first_submit = min(j.submit for j in jobs)
    last_end = max(starts[j.id] + j.runtime for j in jobs)
    waits = [starts[j.id] - j.submit for j in jobs]
    work = sum(j.runtime * j.tasks * j.resources.cpu // CPU_MILLI for j in jobs)
    late = [i for i, promised in result.first_reservation.items() if starts[i] > promised]
    wide = [starts[j.id] - j.submit for j in jobs if j.tasks * j.resources.cpu >= WIDE * 1000]
    return {
        "mean_wait_s": round(sum(waits) / len(jobs), 1),
        "median_wait_s": round(sorted(waits)[len(waits) // 2], 1),
        **slowdowns(jobs, starts),
        "utilisation": round(work / (procs * (last_end - first_submit)), 4),
        "makespan_s": round(last_end - first_submit, 1),
        "cycles": result.cycles,
        "mean_cycle_ms": round(1000 * result.cycle_seconds / max(result.cycles, 1), 3),
        "reserved_jobs": len(result.first_reservation),
        "reserved_jobs_started_late": len(late),
        "worst_late_start_s": round(
            max((starts[i] - result.first_reservation[i] for i in late), default=0.0), 1
        ),
        f"jobs_with_{WIDE}_or_more_procs": len(wide),
        f"worst_wait_{WIDE}_or_more_procs_s": round(max(wide, default=0.0), 1),
        **accuracy(jobs, result),
    }


def bsld(job: TraceJob, start: float) -> float:
    return max(1.0, (start - job.submit + job.runtime) / max(job.runtime, TAU))


def slowdowns(jobs: list[TraceJob], starts: dict[int, float]) -> dict[str, Any]:
    """Mean bounded slowdown overall and per user: the worst-off and the median user's mean
    (users with at least 10 jobs, so one job is not a user's whole story) and Jain's index
    over every user's mean, (sum x)^2 / (n sum x^2): 1 when all users fare alike."""
    per_user: dict[str, list[float]] = defaultdict(list)
    waits: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        per_user[j.owner].append(bsld(j, starts[j.id]))
        waits[j.owner].append(starts[j.id] - j.submit)
    means = {u: sum(v) / len(v) for u, v in per_user.items()}
    total = sum(sum(v) for v in per_user.values())
    jain = sum(means.values()) ** 2 / (len(means) * sum(m * m for m in means.values()))
    steady = {u: m for u, m in means.items() if len(per_user[u]) >= 10} or means
    worst = max(steady, key=lambda u: steady[u])
    middle = sorted(steady.values())[len(steady) // 2]
    return {
        "mean_bounded_slowdown": round(total / len(jobs), 2),
        "users": len(means),
        "worst_user": {
            "user": worst,
            "jobs": len(per_user[worst]),
            "mean_bounded_slowdown": round(means[worst], 2),
            "mean_wait_s": round(sum(waits[worst]) / len(waits[worst]), 1),
        },
        "jain_index_users_mean_bsld": round(jain, 4),
        "median_user_mean_bsld": round(middle, 2),
    }


def accuracy(jobs: list[TraceJob], result: ReplayResult) -> dict[str, Any]:
    """How close the runtime each job was planned by (its prediction, else its walltime)
    came to its run time, and the start estimates made at submission to the starts, for
    the jobs that waited."""
    ratios = []
    for j in jobs:
        planned = result.predicted.get(j.id, j.walltime)
        if planned is not None and max(planned, j.runtime) > 0:
            ratios.append(min(planned, j.runtime) / max(planned, j.runtime))
    waited = [j for j in jobs if result.starts[j.id] > j.submit]
    errors = sorted(
        abs(result.estimates[j.id] - result.starts[j.id])
        for j in waited
        if j.id in result.estimates
    )
    out: dict[str, Any] = {
        "mean_runtime_accuracy": round(sum(ratios) / max(len(ratios), 1), 4),
    }
    if result.estimates:
        out["start_estimates"] = {
            "jobs_that_waited": len(waited),
            "with_an_estimate": len(errors),
            "mean_abs_error_s": round(sum(errors) / max(len(errors), 1), 1),
            "median_abs_error_s": round(errors[len(errors) // 2], 1) if errors else None,
        }
    return out


def _swf_row(r: swf.Replayed) -> list[str]:
    """One job in the Standard Workload Format, as Berth replays it: run time capped at the
    walltime, its processors, a nominal memory request (AccaSim divides by every requested
    resource)."""
    j = r.job
    return [
        str(j.id), str(int(j.submit)), "-1", str(int(r.runtime)), str(r.procs), "-1", "-1",
        str(r.procs), str(int(r.walltime or -1)), "1", "1", str(j.user), str(j.group),
        "-1", "-1", "-1", "-1", "-1",
    ]  # fmt: skip


def run_accasim(python: str, rows: list[list[str]], nodes: int, per_node: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        trace = Path(work) / "trace.swf"
        trace.write_text("".join(" ".join(r) + "\n" for r in rows))
        driver = ROOT / "bench" / "accasim_easy.py"
        command = [python, str(driver), str(trace), "--nodes", str(nodes)]
        done = subprocess.run(
            [*command, "--cores-per-node", str(per_node)],
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
        )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    last: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return last


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE, help="SWF (.swf, .swf.gz) or CSV")
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs (default: all)")
    parser.add_argument("--policies", default="fcfs,easy,default")
    parser.add_argument("--correction", choices=("walltime", "stepwise"), default="walltime")
    parser.add_argument("--no-estimates", action="store_true", help="skip start estimates")
    fair_share_arguments(parser)
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
    args.policy_list = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policy_list if p not in POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)} (choose {', '.join(POLICIES)})")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not args.trace.exists():
        parser.error(f"--trace: {args.trace} not found")
    if args.accasim_python and not Path(args.accasim_python).exists():
        parser.error(f"--accasim-python: {args.accasim_python} not found")
    return args


def fair_share_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fair-share` and its weights, defaulting to the product's settings."""
    add = parser.add_argument
    add(
        "--fair-share",
        choices=("off", "on", "both"),
        default="off",
        help="order by the multifactor priority with per-user fair share (both: off, then on)",
    )
    add("--half-life", type=float, default=7 * 86400.0, help="BERTH_FAIRSHARE_HALF_LIFE (s)")
    add("--weight-age", type=float, default=1000.0, help="BERTH_PRIORITY_WEIGHT_AGE")
    add("--weight-fairshare", type=float, default=10000.0, help="BERTH_PRIORITY_WEIGHT_FAIRSHARE")
    add("--weight-priority", type=float, default=100.0, help="BERTH_PRIORITY_WEIGHT_PRIORITY")
    add("--max-age", type=float, default=7 * 86400.0, help="BERTH_PRIORITY_MAX_AGE (s)")
    add("--cpu-weight", type=float, default=1.0, help="BERTH_FAIRSHARE_CPU_WEIGHT")
    add("--gpu-weight", type=float, default=10.0, help="BERTH_FAIRSHARE_GPU_WEIGHT")
    add("--refresh", type=float, default=60.0,
        help="BERTH_FAIRSHARE_REFRESH_SECONDS: read usage at most this often (s)")  # fmt: skip


def main() -> None:
    args = arguments()
    log = read_log(args.trace, args.jobs)
    jobs, kept, left_out, nodes = load(log)
    per_node = Resources(cpu=CPU_MILLI * log.procs_per_node, memory=MEMORY)
    fair = {"off": [False], "on": [True], "both": [False, True]}[args.fair_share]
    results = [
        run(jobs, nodes, per_node, policy, args, on) for policy in args.policy_list for on in fair
    ]
    summary: dict[str, Any] = {
        "trace": args.trace.name,
        "jobs_read": len(log.jobs),
        "jobs": len(jobs),
        "left_out": left_out,
        "malformed_lines": log.malformed,
        "nodes": nodes,
        "processors_per_node": log.procs_per_node,
        "results": results,
    }
    summary |= compare({r["policy"]: r for r in results})
    if args.accasim_python:
        rows = [_swf_row(r) for r in kept]
        accasim = run_accasim(args.accasim_python, rows, nodes, log.procs_per_node)
        summary["accasim_easy"] = accasim
        easy = summary.get("results_by_policy", {}).get("easy")
        if easy and "wall_seconds" in accasim:
            summary["berth_vs_accasim_easy"] = {
                "wall_ratio": round(easy["wall_seconds"] / accasim["wall_seconds"], 3),
                "cpu_ratio": round(easy["cpu_seconds"] / accasim["cpu_seconds"], 3),
            }
    summary.pop("results_by_policy", None)
    print(json.dumps(summary, indent=1))


def compare(by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """EASY against FCFS, and EASY++ against EASY: the figures side by side."""
    out: dict[str, Any] = {"results_by_policy": by_policy}
    fcfs, easy, plus = by_policy.get("fcfs"), by_policy.get("easy"), by_policy.get("easy++")
    if fcfs and easy:
        out["easy_vs_fcfs"] = {
            "wait_reduction": round(1 - easy["mean_wait_s"] / fcfs["mean_wait_s"], 4),
            "slowdown_reduction": round(
                1 - easy["mean_bounded_slowdown"] / fcfs["mean_bounded_slowdown"], 4
            ),
        }
    if easy and plus:
        out["easy_vs_easy++"] = {"[easy, easy++]": side_by_side(easy, plus)}
    fair = {p: side_by_side(by_policy[p], by_policy[p + " fs"])
            for p in by_policy if p + " fs" in by_policy}  # fmt: skip
    if fair:
        out["fair_share_off_vs_on"] = {"[off, on]": fair}
    return out


def side_by_side(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """Two results' headline figures, each as [a, b]."""
    keys = (
        "mean_bounded_slowdown", "mean_wait_s", "jain_index_users_mean_bsld",
        "median_user_mean_bsld",
    )  # fmt: skip
    side = {k: [a[k], b[k]] for k in keys}
    side["worst_user_mean_bsld"] = [
        a["worst_user"]["mean_bounded_slowdown"],
        b["worst_user"]["mean_bounded_slowdown"],
    ]
    side["mean_runtime_accuracy"] = [a["mean_runtime_accuracy"], b["mean_runtime_accuracy"]]
    if "start_estimates" in a and "start_estimates" in b:
        side["start_estimate_mean_abs_error_s"] = [
            a["start_estimates"]["mean_abs_error_s"],
            b["start_estimates"]["mean_abs_error_s"],
        ]
    side["wall_seconds"] = [a["wall_seconds"], b["wall_seconds"]]
    return side


if __name__ == "__main__":
    main()
