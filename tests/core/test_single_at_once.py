"""A job that needs its one pending task, asking whole devices or none, is placed and
committed without a statement's task loop (`actions._place_single`, `statement.commit_one`):
it must bind exactly as the loop does (the same task on the same node and devices, in the
same order), leave the same statuses, failures and evictions, and go around EASY's
reservation the same way (`_AroundReservation.one`). Each cluster runs a cycle both ways."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import actions
from scheduler.core.cycle import run_actions
from scheduler.core.model import JobInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.plugins import default_plugins
from scheduler.core.session import Session
from scheduler.core.statement import Statement
from tests.core.builders import POLICIES, job
from tests.core.test_alike_at_once import crafted, random_snapshot
from tests.core.test_alike_refusals import alike_clusters
from tests.core.test_properties import CONFIGS, FAST, clusters


def decide(snap: Snapshot, config: SchedulingPolicy, single: bool, explain: bool) -> Any:
    return outcome(*decided(snap, config, single, explain))


def decided(
    snap: Snapshot, config: SchedulingPolicy, single: bool, explain: bool
) -> tuple[Session, Any]:
    """The session after one cycle's actions, with or without the one-task path, and what
    the actions returned."""
    session = Session(snap, config, default_plugins(config), explain=explain)
    session.single_at_once = single
    return session, run_actions(session)


def outcome(session: Session, result: Any) -> tuple[Any, ...]:
    """Everything a cycle decided or changed in its session, comparable between paths."""
    binds = [(b.job_id, b.task_id, b.node, b.devices, b.action, b.instance) for b in result.binds]
    statuses = sorted(
        (i, s.code, s.message, list(s.node_reasons.items()), s.estimated_start)
        for i, s in result.pending.items()
    )
    failures = sorted(
        (i, f.code, f.message, f.blocked_by_resources, list(f.node_reasons.items()))
        for i, f in session.failures.items()
    )
    free = [(n.name, n.free_cpu, n.free_memory, n.free_devices) for n in session.nodes]
    held = {name: (q.allocated, q.shared_gpu) for name, q in session.queues.items()}
    evictions = [(e.job_id, e.preemptor_job_id, e.message) for e in result.evictions]
    return binds, statuses, failures, evictions, free, held, session.version


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_clusters_place_single_tasks_as_the_task_loop(policy: str, explain: bool) -> None:
    config = POLICIES[policy]
    placed = 0
    for seed in range(150):
        snap = random_snapshot(random.Random(seed))
        single = decide(snap, config, True, explain)
        assert single == decide(snap, config, False, explain), f"seed {seed}"
        placed += len(single[0])
    assert placed > 100


@FAST
@given(clusters(), CONFIGS, st.booleans())
def test_any_cluster_places_single_tasks_as_the_task_loop(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    assert decide(snap, config, True, explain) == decide(snap, config, False, explain)


@FAST
@given(alike_clusters(), CONFIGS, st.booleans())
def test_alike_clusters_place_single_tasks_as_the_task_loop(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    assert decide(snap, config, True, explain) == decide(snap, config, False, explain)


def test_single_tasks_skip_the_task_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path is taken: jobs of one task (6 asks a device, 9 none, both around the
    reservation or not) never reach the task loop nor `Statement.allocate`."""
    looped: list[int] = []
    allocate_tasks = actions._allocate_tasks

    def counting(session: Session, job: JobInfo, *args: Any) -> tuple[int, TaskInfo | None]:
        looped.append(job.id)
        return allocate_tasks(session, job, *args)

    allocated: list[int] = []
    allocate = Statement.allocate

    def by_statement(self: Statement, job: JobInfo, task: TaskInfo, node: Any) -> Any:
        allocated.append(job.id)
        return allocate(self, job, task, node)

    monkeypatch.setattr(actions, "_allocate_tasks", counting)
    monkeypatch.setattr(Statement, "allocate", by_statement)
    snap = crafted()
    jobs = [j for j in snap.jobs if j.id not in (6, 9)]
    jobs += [job(6, cpu=1, gpu=1, walltime=100), job(9, cpu=3, walltime=10)]
    snap = Snapshot(snap.now, snap.nodes, snap.queues, jobs)
    result = decide(snap, SchedulingPolicy.easy(), True, True)
    assert {b[0] for b in result[0]} >= {6, 9}
    assert 6 not in looped and 9 not in looped
    assert 6 not in allocated and 9 not in allocated
