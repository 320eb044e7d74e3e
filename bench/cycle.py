"""Time one full scheduler cycle of the core on a synthetic cluster and backlog.

    python bench/cycle.py --nodes 1000 --gpus-per-node 8 --jobs 10000 --seed 1
    python bench/cycle.py --sweep          # 1k/10k/100k jobs on 1,000 nodes; 100/1k/10k nodes
    python bench/cycle.py --nodes 10000 --jobs 100000 --factors --digest   # and what it decided
    python bench/cycle.py --nodes 10000 --jobs 100000 --factors --steady   # the cycle after it

The cluster has GPU nodes of two models (labels) and some CPU-only nodes; a third of the GPUs
are held by running jobs with walltimes (so preemption and backfill have work). The backlog
mixes CPU-only, 1/2/4/8-GPU and multi-node gang jobs over several queues and priorities, with a
few unplaceable jobs (a selector no node matches, more GPUs than any node has). Prints JSON.

That first ("cold") cycle starts half the backlog at once. `--steady` measures the cycle a
running scheduler repeats once the backlog has been placed: one cycle is run, its binds are
applied to the snapshot as the cycle loop's next snapshot shows them (`settle`), and the
cycles after it are measured (the jobs still pending and all that now runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.cycle import CycleResult, run_cycle  # noqa: E402
from scheduler.core.model import (  # noqa: E402
    DeviceInfo,
    JobInfo,
    NodeInfo,
    QueueInfo,
    SchedulingPolicy,
    Snapshot,
    TaskInfo,
)
from scheduler.core.priority import PriorityWeights  # noqa: E402
from scheduler.core.resources import Resources  # noqa: E402

GI = 1 << 30
NOW = 1_000_000.0


def build(nodes: int, gpus: int, jobs: int, seed: int, queues: int) -> Snapshot:
    rng = random.Random(seed)
    node_infos = _nodes(nodes, gpus)
    queue_infos = [QueueInfo(name=f"q{i}", weight=float(i + 1)) for i in range(queues)]
    maker = _JobMaker(rng)
    job_infos = _running_jobs(maker, node_infos, gpus, queues)
    job_infos += [_pending_job(maker, gpus, queues) for _ in range(jobs)]
    return Snapshot(now=NOW, nodes=node_infos, queues=queue_infos, jobs=job_infos)


def _nodes(nodes: int, gpus: int) -> list[NodeInfo]:
    """GPU nodes of two labelled models; every tenth node CPU-only."""
    node_infos = []
    for i in range(nodes):
        cpu_only = i % 10 == 9
        node_infos.append(
            NodeInfo(
                name=f"node-{i:05d}",
                allocatable=Resources(cpu=64_000, memory=512 * GI, gpu=0 if cpu_only else gpus),
                labels={} if cpu_only else {"gpu-model": "h100" if i % 3 else "a100"},
                devices=[] if cpu_only else [DeviceInfo(d) for d in range(gpus)],
            )
        )
    return node_infos


class _JobMaker:
    """Jobs with consecutive ids and task ids, drawing from one random stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.task_id = 0
        self.next_id = 1

    def __call__(self, state: str, **kw: Any) -> JobInfo:
        replicas = kw.pop("replicas", 1)
        gpu = kw.pop("gpu", 0)
        selector = kw.pop("selector", {})
        placed = kw.pop("placed", None)
        tasks = []
        for r in range(replicas):
            self.task_id += 1
            node, devices = placed[r] if placed else (None, ())
            tasks.append(
                TaskInfo(
                    id=self.task_id,
                    group="main",
                    index=r,
                    resources=Resources(cpu=4000, memory=32 * GI, gpu=gpu),
                    node_selector=selector,
                    state="Running" if placed else "Pending",
                    node=node,
                    devices=devices,
                    started_at=NOW - self.rng.randint(0, 3600) if placed else None,
                )
            )
        info = JobInfo(
            id=self.next_id,
            name=f"job-{self.next_id}",
            queue=kw.pop("queue"),
            owner=f"user-{self.next_id % 37}",
            priority=kw.pop("priority", 0),
            preemptible=kw.pop("preemptible", True),
            min_available=replicas,
            created_at=NOW - 100_000 + self.next_id,
            walltime=kw.pop("walltime", 7200.0),
            state=state,
            tasks=tasks,
        )
        self.next_id += 1
        return info


def _running_jobs(
    job: _JobMaker, node_infos: list[NodeInfo], gpus: int, queues: int
) -> list[JobInfo]:
    """A third of each GPU node's devices busy, one 1-GPU job per device."""
    rng = job.rng
    running = []
    for node in node_infos:
        if not node.devices:
            continue
        for d in range(max(1, gpus // 3)):
            running.append(
                job(
                    "Running",
                    gpu=1,
                    placed=[(node.name, (d,))],
                    queue=f"q{rng.randrange(queues)}",
                    priority=rng.choice((0, 1, 2)),
                )
            )
    return running


def _pending_job(job: _JobMaker, gpus: int, queues: int) -> JobInfo:
    """One job of the backlog: 1% unplaceable by selector, 1% larger than any node, then
    CPU-only, 1/2/4-GPU and whole-node gang jobs."""
    rng = job.rng
    roll = rng.random()
    queue = f"q{rng.randrange(queues)}"
    priority = rng.choice((0, 0, 1, 5, 10))
    if roll < 0.01:
        return job("Pending", gpu=1, selector={"gpu-model": "tpu"}, queue=queue)
    if roll < 0.02:
        return job("Pending", gpu=gpus * 2, queue=queue)
    if roll < 0.25:
        return job("Pending", gpu=0, queue=queue, priority=priority)
    if roll < 0.85:
        return job(
            "Pending",
            gpu=rng.choice((1, 1, 1, 2, 4)),
            queue=queue,
            priority=priority,
            selector=rng.choice(({}, {}, {"gpu-model": "h100"})),
        )
    return job(
        "Pending",
        gpu=gpus,
        replicas=rng.choice((2, 4)),
        queue=queue,
        priority=priority,
        walltime=rng.choice((None, 3600.0, 86400.0)),
    )


# `--factors`: the job order of the scheduler loop's default settings, over 37 users with
# different usage (docs/configuration.md#job-priority-and-fair-share).
FACTORS = PriorityWeights(age=1000, fair_share=10_000, priority=100)


def digest(result: CycleResult) -> str:
    """A fingerprint of everything the cycle decided, in the order it decided it: each bind,
    eviction, pending status (code, message, node reasons in order, estimated start) and
    priority factors. Two versions of the core that give a snapshot the same digest made
    the same schedule (a speed-up must leave it as it is)."""
    sha = hashlib.sha256()
    for b in result.binds:
        sha.update(repr((b.job_id, b.task_id, b.node, b.devices, b.action)).encode())
    for e in result.evictions:
        sha.update(repr((e.job_id, e.reason, e.preemptor_job_id, e.message)).encode())
    for job_id, s in result.pending.items():
        reasons = list(s.node_reasons.items())
        sha.update(repr((job_id, str(s.code), s.message, reasons, s.estimated_start)).encode())
    for job_id, f in result.factors.items():
        sha.update(repr((job_id, f)).encode())
    return sha.hexdigest()[:16]


def setup(
    nodes: int, gpus: int, jobs: int, seed: int, queues: int, factors: bool
) -> tuple[Snapshot, SchedulingPolicy]:
    """The snapshot and policy of one size (with `factors`, 37 owners of different usage)."""
    snapshot = build(nodes, gpus, jobs, seed, queues)
    policy = SchedulingPolicy(priority_weights=FACTORS if factors else PriorityWeights())
    if factors:
        snapshot.usage = {f"user-{i}": 1000.0 * i for i in range(37)}
    return snapshot, policy


def settle(snapshot: Snapshot, result: CycleResult) -> None:
    """`snapshot` as the cycle after `result` sees it: each bound task Running on its node
    and devices since now, its job Running. Nothing ends, and the jobs `result` evicted are
    left running as they were (as if their nodes were still to be told): the next cycle
    looks for victims again, as every cycle does in which the first job in line must
    preempt, the costliest of the cycles a running scheduler repeats. (Marked Releasing
    instead, they would let the preemptor wait for them without a search.)"""
    tasks = {t.id: (j, t) for j in snapshot.jobs for t in j.tasks}
    for b in result.binds:
        job, task = tasks[b.task_id]
        task.state, task.node, task.devices = "Running", b.node, b.devices
        task.started_at, task.gpu_instance = snapshot.now, b.instance
        job.state = "Running"


def measure(
    nodes: int,
    gpus: int,
    jobs: int,
    seed: int,
    queues: int,
    repeat: int,
    factors: bool = False,
    with_digest: bool = False,
    steady: bool = False,
) -> dict[str, Any]:
    """The fastest of `repeat` cycles on the snapshot of one size (`steady`: the snapshot
    after one cycle, `settle`)."""
    snapshot, policy = setup(nodes, gpus, jobs, seed, queues, factors)
    if steady:
        settle(snapshot, run_cycle(snapshot, policy))
    best: dict[str, Any] | None = None
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = run_cycle(snapshot, policy)
        total = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        if with_digest:
            decided = digest(result)
            if best is not None and best["digest"] != decided:
                raise AssertionError("the same snapshot gave different decisions")
        if best is None or total < best["total_s"]:
            best = {
                "nodes": nodes,
                "gpus_per_node": gpus,
                "steady": steady,
                # (the backlog built; with `steady`, what of it still waits)
                "pending_jobs": sum(1 for j in snapshot.jobs if j.state == "Pending"),
                "running_jobs": sum(1 for j in snapshot.jobs if j.state == "Running"),
                "queues": queues,
                "factors": factors,
                "total_s": round(total, 4),
                # CPU time of the same run: on a shared machine, wall time also counts
                # waiting for a core.
                "cpu_s": round(cpu, 4),
                "actions_s": {k: round(v, 4) for k, v in result.timings.items() if k != "total"},
                "binds": len(result.binds),
                "jobs_placed": len({b.job_id for b in result.binds}),
                "evictions": len(result.evictions),
                "pending": len(result.pending),
            }
            if with_digest:
                best["digest"] = decided
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported")
    parser.add_argument("--sweep", action="store_true", help="the growth series of the issue")
    parser.add_argument("--factors", action="store_true", help="order by the priority factors")
    parser.add_argument(
        "--digest", action="store_true", help="also print a fingerprint of the decisions"
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="measure the cycle after the first, its binds applied",
    )
    args = parser.parse_args()
    for name in ("nodes", "gpus_per_node", "jobs", "queues", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.sweep:
        print(
            json.dumps(
                measure(
                    args.nodes,
                    args.gpus_per_node,
                    args.jobs,
                    args.seed,
                    args.queues,
                    args.repeat,
                    args.factors,
                    args.digest,
                    args.steady,
                ),
                indent=1,
            )
        )
        return
    series = []
    for jobs in (1_000, 10_000, 100_000):
        row = measure(1000, args.gpus_per_node, jobs, args.seed, args.queues, 1, steady=args.steady)
        series.append({"series": "jobs", **row})
    for nodes in (100, 1_000, 10_000):
        row = measure(
            nodes, args.gpus_per_node, 10_000, args.seed, args.queues, 1, steady=args.steady
        )
        series.append({"series": "nodes", **row})
    print(json.dumps(series, indent=1))


if __name__ == "__main__":
    main()
