"""The FGD paper's experiment on Alibaba's openb GPU trace, through `scheduler.core.gpushare`.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC '23), Fig. 9(a), set up as the authors' simulator
(`hkust-adsl/kubernetes-scheduler-simulator`) runs it:

1. The 1,213 GPU nodes of `openb_node_list_gpu_node.csv` (6,212 GPUs), in an order shuffled
   per seed (the simulator prefixes node names with a random permutation).
2. The pod list of the workload variant, in name order, shuffled per seed; then pods drawn
   with replacement from it are appended until the next would take the GPU demand past
   `--tune` (1.3) times capacity (a list asking for more is cut down at random instead).
   The stop test compares the drawn pod's per-device share, as the simulator's does.
3. Pods arrive in that order and never leave; each is placed by the policy or fails.
4. After each arrival, the GPU allocation ratio (milli-GPUs allocated / capacity) is noted
   against the GPU demand that has arrived (% of capacity); the curve's value at k % is the
   mean of the notes whose arrived demand rounds to k, as the authors' analysis script
   bins them.

FGD's target workload is the variant's own pod list (`typical_tasks`: the shapes making up
95 % of the pods); FGD scores each device in the simulator's whole points and takes the first
best (`--fgd-exact`: exact fragmentation growths), see docs/gpushare.md. Arrivals use
`random.Random(seed)` (the random policy and `--random-ties` a second generator seeded from
it), so every policy sees the same arrivals for a seed. Equally scored nodes: the first in
the shuffled node order, as the authors' scheduler takes the smallest of their permuted names.
Python's generator is not Go's, so single runs differ from the authors'; the means over
seeds compare.

    python bench/gpushare.py                                  # all policies, seeds 42-51
    python bench/gpushare.py --policies best-fit,fgd --seeds 42-44
    python bench/gpushare.py --workload gpuspec33 --policies fgd --fgd-exact

Prints one JSON object: per policy the mean curve (0-130 % by `--step`), the value at 100 %
per seed, seconds per run, and the authors' cached means for the same workload beside them.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core import gpushare  # noqa: E402
from scheduler.core.gpushare import GpuNode, GpuTask  # noqa: E402

TRACES = ROOT.parent / "shared" / "bench" / "traces"  # ../shared/... from the checkout
NODES = TRACES / "alibaba_openb_node_list_gpu_node.csv"
PUBLISHED = TRACES / "fgd_atc23_expected_analysis_allo_discrete.csv"
WORKLOADS = ("default", "gpushare100", "multigpu50", "gpuspec33")
POLICIES = ("random", "dot-product", "gpu-clustering", "gpu-packing", "best-fit", "fgd")
AUTHORS_NAME = {
    "random": "01-Random",
    "dot-product": "02-DotProd",
    "gpu-clustering": "03-GpuClustering",
    "gpu-packing": "04-GpuPacking",
    "best-fit": "05-BestFit",
    "fgd": "06-FGD",
}
TIES_SALT = 0x5EED


def read_nodes(path: Path = NODES) -> list[GpuNode]:
    with path.open() as handle:
        return [
            GpuNode(
                row["sn"],
                row["model"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
            )  # fmt: skip
            for row in csv.DictReader(handle)
        ]


def read_tasks(workload: str) -> list[tuple[str, GpuTask]]:
    """(name, task) for every pod of the variant, in name order."""
    path = TRACES / f"alibaba_openb_pod_list_{workload}.csv"
    tasks = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            num_gpu = int(row["num_gpu"])
            spec = row.get("gpu_spec") or ""
            task = GpuTask(
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                num_gpu=num_gpu,
                gpu_milli=int(row["gpu_milli"]) if num_gpu else 0,
                gpu_models=frozenset(spec.split("|")) if spec else frozenset(),
            )
            tasks.append((row["name"], task))
    return sorted(tasks, key=lambda pair: pair[0])


def arrivals(pods: list[GpuTask], capacity: int, tune: float, rng: random.Random) -> list[GpuTask]:
    """The pods shuffled, then grown (or cut) at random to `tune` x capacity of GPU demand."""
    order = list(pods)
    rng.shuffle(order)
    demand = sum(task.gpu_total for task in order)
    target = tune * capacity
    while demand > target and order:
        demand -= order.pop(rng.randrange(len(order))).gpu_total
    while True:
        drawn = pods[rng.randrange(len(pods))]
        if demand + drawn.gpu_milli > target:  # the simulator tests the per-device share
            return order
        order.append(drawn)
        demand += drawn.gpu_total


def make_policy(name: str, pods: list[GpuTask], quantized: bool) -> gpushare.Policy:
    if name == "fgd":
        return gpushare.FGD(gpushare.typical_tasks(pods), quantized=quantized)
    return gpushare.POLICIES[name]()


def run_once(
    policy_name: str, pods: list[GpuTask], seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One seed under one policy: the curve by whole % of arrived demand, and the time taken."""
    rng = random.Random(seed)
    nodes = read_nodes()
    rng.shuffle(nodes)
    capacity = sum(node.gpus for node in nodes) * gpushare.MILLI
    sequence = arrivals(pods, capacity, args.tune, rng)
    policy = make_policy(policy_name, pods, not args.fgd_exact)
    ties = random.Random(seed ^ TIES_SALT)
    cluster = gpushare.Cluster(nodes, policy, ties, random_ties=args.random_ties)
    sums: dict[int, float] = defaultdict(float)
    counts: dict[int, int] = defaultdict(int)
    arrived = failed = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for task in sequence:
        arrived += task.gpu_total
        if cluster.place(task) is None:
            failed += 1
        level = round(100 * arrived / capacity)
        sums[level] += 100 * cluster.allocated / capacity
        counts[level] += 1
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    curve = {level: sums[level] / counts[level] for level in sorted(counts)}
    return {
        "curve": curve,
        "seconds": seconds,
        "cpu": cpu,
        "tasks": len(sequence),
        "failed": failed,
    }


def published(workload: str) -> dict[str, dict[int, float]]:
    """The authors' cached curves for the workload, mean over their seeds, by policy."""
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with PUBLISHED.open() as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == f"openb_pod_list_{workload}":
                rows[row["sc_policy"]].append(row)
    out = {}
    for ours, theirs in AUTHORS_NAME.items():
        if rows[theirs]:
            out[ours] = {
                level: statistics.fmean(float(r[str(level)]) for r in rows[theirs])
                for level in range(0, 131)
            }
    return out


def at(curve: dict[int, float], level: int) -> float | None:
    """The curve at `level` %, or at the nearest level below it that was reached."""
    reached = [lvl for lvl in curve if lvl <= level]
    return curve[max(reached)] if reached else None


def summarise(
    policy: str,
    runs: list[dict[str, Any]],
    theirs: dict[int, float] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    levels = range(0, args.demand_max + 1, args.step)
    mean = {lvl: statistics.fmean(at(r["curve"], lvl) or 0.0 for r in runs) for lvl in levels}
    at100 = [round(at(r["curve"], 100) or 0.0, 2) for r in runs]
    out: dict[str, Any] = {
        "alloc_pct_at_100": round(statistics.fmean(at100), 2),
        "alloc_pct_at_100_per_seed": at100,
        "curve": {str(lvl): round(v, 2) for lvl, v in mean.items()},
        "seconds_per_run": round(statistics.fmean(r["seconds"] for r in runs), 2),
        "cpu_seconds_per_run": round(statistics.fmean(r["cpu"] for r in runs), 2),
        "tasks_per_run": round(statistics.fmean(r["tasks"] for r in runs)),
        "failed_per_run": round(statistics.fmean(r["failed"] for r in runs)),
    }
    if theirs:
        out["published_at_100"] = round(theirs[100], 2)
        out["published_curve"] = {str(lvl): round(theirs[lvl], 2) for lvl in levels}
        out["difference_at_100_points"] = round(out["alloc_pct_at_100"] - theirs[100], 2)
    return out


def seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="default")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    parser.add_argument("--seeds", type=seeds, default=seeds("42-51"), help="42-51 or 42,43")
    parser.add_argument("--tune", type=float, default=1.3, help="arrived GPU demand / capacity")
    parser.add_argument("--demand-max", type=int, default=130, help="last curve point, %%")
    parser.add_argument("--step", type=int, default=10, help="curve points every this many %%")
    parser.add_argument(
        "--fgd-exact", action="store_true",
        help="FGD compares exact fragmentation growths, not the simulator's whole points",
    )  # fmt: skip
    parser.add_argument(
        "--random-ties", action="store_true",
        help="equally scored nodes: one at random, not the first in the (shuffled) node order",
    )  # fmt: skip
    args = parser.parse_args()
    args.policy_list = args.policies.split(",")
    unknown = set(args.policy_list) - set(POLICIES) - set(gpushare.POLICIES)
    if unknown:
        parser.error(f"unknown policies: {sorted(unknown)}")
    return args


def main() -> None:
    args = arguments()
    pods = [task for _, task in read_tasks(args.workload)]
    theirs = published(args.workload)
    results = {}
    for policy in args.policy_list:
        runs = [run_once(policy, pods, seed, args) for seed in args.seeds]
        results[policy] = summarise(policy, runs, theirs.get(policy), args)
    summary = {
        "workload": args.workload,
        "seeds": args.seeds,
        "tune": args.tune,
        "fgd_exact": args.fgd_exact,
        "random_ties": args.random_ties,
        "pods_in_list": len(pods),
        "results": results,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
