"""A job's alike cpu-only tasks placed in one node scan (`_allocate_alike`) bind exactly as
placing them one by one does: the same tasks on the same nodes in the same order, the same
reasons for the jobs that wait, on small clusters mixing node sizes, label selectors, GPUs
(tasks with devices go one by one), a cordoned node, queues with a capability (one by one),
gangs smaller than their jobs and reservations that backfilled jobs must fit around."""

from __future__ import annotations

import random
from typing import Any

import pytest

from scheduler.core.cycle import CycleResult, run_actions
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session
from scheduler.core.statement import Statement
from scheduler.core.types import NodeView
from tests.core.builders import GI, NOW, POLICIES, job, node, snapshot


def decide(snap: Snapshot, config: SchedulingPolicy, at_once: bool, explain: bool) -> CycleResult:
    session = Session(snap, config, default_plugins(config), explain=explain)
    session.alike_at_once = at_once
    return run_actions(session)


def outcome(result: CycleResult) -> tuple[Any, ...]:
    binds = [(b.job_id, b.task_id, b.node, b.devices, b.action) for b in result.binds]
    pending = {
        i: (s.code, s.message, s.node_reasons, s.estimated_start) for i, s in result.pending.items()
    }
    return binds, pending, [(e.job_id, e.preemptor_job_id) for e in result.evictions]


def crafted() -> Snapshot:
    nodes = [
        node("big", cpu=16, memory_gi=64),
        node("small", cpu=2, memory_gi=4),
        node("gpu", gpus=4, cpu=8, memory_gi=32),
        node("east", cpu=4, memory_gi=16, labels={"zone": "east"}),
        node("east2", cpu=4, memory_gi=8, labels={"zone": "east"}),
        node("off", cpu=32, memory_gi=64, state="Cordoned"),
    ]
    jobs = [
        job(1, cpu=12, replicas=1, running_on=[("big", ())], walltime=600, preemptible=False),
        job(2, cpu=1, gpu=2, running_on=[("gpu", (0, 1))], walltime=1200, preemptible=False),
        job(3, cpu=4, replicas=5, walltime=900),  # blocked: holds the reservation
        job(4, cpu=1, replicas=5, min_available=3, walltime=300),  # gang of 3, 2 extras
        job(5, cpu=1, memory_gi=6, replicas=3, selector={"zone": "east"}, walltime=5000),
        job(6, cpu=1, gpu=1, replicas=2, walltime=100),  # devices: one by one
        job(7, cpu=0.5, replicas=4, walltime=50_000),  # must fit around the reservation
        job(8, cpu=1, replicas=2, queue="capped", walltime=100),  # capability: one by one
        job(9, cpu=3, replicas=2, walltime=10),
    ]
    queues = [QueueInfo("default"), QueueInfo("capped", capability=Resources(2500, 8 * GI, 0))]
    return snapshot(nodes, jobs, queues)


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_crafted_cluster_binds_the_same_at_once_as_task_by_task(policy, explain):
    config = POLICIES[policy]
    snap = crafted()  # (a cycle does not change its snapshot)
    at_once = outcome(decide(snap, config, True, explain))
    by_task = outcome(decide(snap, config, False, explain))
    assert at_once == by_task
    assert at_once[0], "something was placed"


def random_snapshot(rng: random.Random) -> Snapshot:
    nodes: list[NodeInfo] = []
    for i in range(rng.randint(3, 9)):
        labels = {"zone": rng.choice(["east", "west"])} if rng.random() < 0.4 else {}
        state = "Cordoned" if rng.random() < 0.1 else "Ready"
        gpus = rng.choice([0, 0, 0, 2, 4])
        nodes.append(
            node(f"n{i}", gpus, rng.choice([1, 2, 4, 8]), rng.choice([2, 8, 32]), labels, state)
        )
    free = {n.name: [n.allocatable.cpu, n.allocatable.memory] for n in nodes}
    jobs: list[JobInfo] = []
    for i in range(1, rng.randint(8, 24)):
        replicas = rng.choice([1, 1, 2, 3, 4, 6, 10])
        cpu = rng.choice([0.5, 1, 1, 2, 3])
        memory = rng.choice([1, 1, 2, 4])
        selector = {"zone": rng.choice(["east", "west"])} if rng.random() < 0.2 else None
        walltime = rng.choice([None, 60.0, 600.0, 3600.0, 36000.0])
        running_on: list[tuple[str, tuple[int, ...]]] | None = None
        if rng.random() < 0.3 and selector is None:
            running_on = []
            for _ in range(replicas):
                fit = [n for n, f in free.items() if f[0] >= cpu * 1000 and f[1] >= memory * GI]
                if not fit:
                    break
                name = rng.choice(fit)
                free[name][0] -= int(cpu * 1000)
                free[name][1] -= memory * GI
                running_on.append((name, ()))
            if len(running_on) < replicas:
                continue  # (what it took stays taken: the free counts stay low enough)
        jobs.append(
            job(
                i,
                cpu=cpu,
                memory_gi=memory,
                gpu=rng.choice([0, 0, 0, 0, 1]) if running_on is None else 0,
                replicas=replicas,
                min_available=rng.randint(1, replicas) if rng.random() < 0.3 else None,
                priority=rng.choice([0, 0, 1]),
                queue=rng.choice(["default", "default", "other", "capped"]),
                selector=selector,
                walltime=walltime,
                preemptible=rng.random() < 0.3,
                running_on=running_on,
                started_at=NOW - rng.choice([10, 100, 1000]),
            )
        )
    queues = [
        QueueInfo("default"),
        QueueInfo("other", weight=2.0),
        QueueInfo("capped", capability=Resources(4000, 16 * GI, 1)),
    ]
    return snapshot(nodes, jobs, queues)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_clusters_bind_the_same_at_once_as_task_by_task(policy):
    config = POLICIES[policy]
    placed = 0
    for seed in range(150):
        explain = seed % 3 == 0
        snap = random_snapshot(random.Random(seed))
        at_once = outcome(decide(snap, config, True, explain))
        by_task = outcome(decide(snap, config, False, explain))
        assert at_once == by_task, f"seed {seed}"
        placed += len(at_once[0])
    assert placed > 100


def test_alike_cpu_only_tasks_are_not_allocated_one_by_one(monkeypatch):
    """The path is taken: no task of jobs 4, 7 (around the reservation) or 9 (alike, no
    devices) goes through `Statement.allocate`; job 6 (devices) and job 8 (a queue with a
    capability) do."""
    one_by_one: list[int] = []
    allocate = Statement.allocate

    def counting(self: Statement, job: JobInfo, task: TaskInfo, node: NodeView) -> tuple[int, ...]:
        one_by_one.append(job.id)
        return allocate(self, job, task, node)

    monkeypatch.setattr(Statement, "allocate", counting)
    result = decide(crafted(), SchedulingPolicy.easy(), True, False)
    assert {b.job_id for b in result.binds} == {4, 6, 7, 8, 9}
    assert result.pending[3].code == "Reserved"
    assert set(one_by_one) == {6, 8}
