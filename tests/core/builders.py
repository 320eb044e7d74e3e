"""Small builders for core tests: clusters and jobs in one line each."""

from __future__ import annotations

import itertools
from typing import Any

from scheduler.core.model import (
    DeviceInfo,
    JobInfo,
    MigInfo,
    NodeInfo,
    QueueInfo,
    SchedulingPolicy,
    Snapshot,
    TaskInfo,
)
from scheduler.core.quantity import mig_share
from scheduler.core.resources import Resources

GI = 1 << 30
NOW = 10_000.0
# The policies the core's equivalence tests run each case under.
POLICIES = {
    "easy": SchedulingPolicy.easy(),
    "fcfs": SchedulingPolicy.fcfs(),
    "default": SchedulingPolicy(),
    "spread": SchedulingPolicy(node_order="spread"),
    "loose": SchedulingPolicy(strict_order=False),
}
_task_ids = itertools.count(1)


def node(
    name: str,
    gpus: int = 0,
    cpu: int = 8,
    memory_gi: int = 64,
    labels: dict[str, str] | None = None,
    state: str = "Ready",
    sharing: tuple[str, ...] = (),
    gpu_memory_gi: int = 0,
    mig: dict[int, list[str]] | None = None,
) -> NodeInfo:
    """`mig`: GPU index -> the profiles of its MIG instances, whose UUIDs are
    `mig_uuid(name, index, k)` (the node then offers "mig" besides `sharing`)."""
    mig = mig or {}
    return NodeInfo(
        name=name,
        allocatable=Resources(cpu * 1000, memory_gi * GI, gpus),
        labels=labels or {},
        state=state,
        devices=[
            DeviceInfo(
                i,
                memory=gpu_memory_gi * GI,
                mig=tuple(MigInfo(p, mig_uuid(name, i, k)) for k, p in enumerate(mig.get(i, []))),
            )
            for i in range(gpus)
        ],
        sharing=tuple(sorted({*sharing, "mig"})) if mig else sharing,
    )


def mig_uuid(node: str, index: int, k: int) -> str:
    return f"MIG-{node}-{index}-{k}"


def job(
    id: int,
    *,
    gpu: int = 0,
    cpu: float = 1,
    memory_gi: int = 1,
    replicas: int = 1,
    min_available: int | None = None,
    priority: int = 0,
    queue: str = "default",
    selector: dict[str, str] | None = None,
    walltime: float | None = 3600.0,
    preemptible: bool = True,
    created_at: float | None = None,
    running_on: list[tuple[str, tuple[int, ...]]] | None = None,
    started_at: float = NOW - 100,
    state: str | None = None,
    owner: str = "u",
    share: int = 0,
    gpu_memory_gi: int = 0,
    modes: tuple[str, ...] = (),
    mig: str = "",
    instances: list[str] | None = None,
    **extra: Any,
) -> JobInfo:
    """A job; `running_on` places its tasks (node, devices) and makes it Running. `share`
    (thousandths) makes each task ask for that fraction of one GPU; `mig` for a MIG
    instance of that profile (`instances`: the UUIDs its placed tasks hold)."""
    share = mig_share(mig) if mig else share
    tasks = []
    for i in range(replicas):
        placed = running_on[i] if running_on and i < len(running_on) else None
        tasks.append(
            TaskInfo(
                id=next(_task_ids),
                group="main",
                index=i,
                resources=Resources(
                    int(cpu * 1000), memory_gi * GI, 0 if mig else 1 if share else gpu
                ),
                node_selector=selector or {},
                state="Running" if placed else "Pending",
                node=placed[0] if placed else None,
                devices=placed[1] if placed else (),
                started_at=started_at if placed else None,
                gpu_share=share,
                gpu_memory=gpu_memory_gi * GI,
                gpu_modes=modes,
                gpu_mig=mig,
                gpu_instance=(instances or [])[i] if placed and instances else "",
            )
        )
    return JobInfo(
        id=id,
        name=f"job-{id}",
        queue=queue,
        owner=owner,
        priority=priority,
        preemptible=preemptible,
        min_available=replicas if min_available is None else min_available,
        created_at=float(id) if created_at is None else created_at,
        walltime=walltime,
        state=state or ("Running" if running_on else "Pending"),
        tasks=tasks,
        **extra,
    )


def snapshot(
    nodes: list[NodeInfo],
    jobs: list[JobInfo],
    queues: list[QueueInfo] | None = None,
    now: float = NOW,
) -> Snapshot:
    return Snapshot(now=now, nodes=nodes, queues=queues or [QueueInfo("default")], jobs=jobs)


def placed_jobs(result: Any) -> set[int]:
    return {b.job_id for b in result.binds}
