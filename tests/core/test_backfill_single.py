"""Backfill starts a job that needs its one pending task in one call
(`backfill._Backfill._start_single`: `_try`, `place`, `_place_single` and `_consume_spare`
spelled out, the node order asked for the first task of the shape the pass saw, the
resources read from the alike key's shape). It must decide exactly as the long way
(`Session.single_in_backfill` False): the same binds, statuses, failures, evictions, what is
free on each node, what each queue holds, the session's version, the bound tasks, the
totals, the placed and nominated jobs and what the per-user limits count. Each cluster runs
a cycle both ways."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import backfill as backfill_module
from scheduler.core.cycle import run_actions
from scheduler.core.model import SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.session import Session
from tests.core.builders import POLICIES, job, node, snapshot
from tests.core.test_alike_at_once import random_snapshot
from tests.core.test_alike_refusals import alike_clusters
from tests.core.test_properties import CONFIGS, FAST, clusters
from tests.core.test_single_at_once import outcome
from tests.core.test_single_at_once_cases import CASES, count_successes, touched
from tests.core.test_single_at_once_cases import CONFIGS as CASE_CONFIGS


def decide(snap: Snapshot, config: SchedulingPolicy, fused: bool, explain: bool) -> Any:
    session = Session(snap, config, default_plugins(config), explain=explain)
    session.single_in_backfill = fused
    result = run_actions(session)
    return (*outcome(session, result), *touched(session), sorted(session.plan_harmless))


def _both_ways(snap: Snapshot, config: SchedulingPolicy, explain: bool) -> tuple[Any, Any]:
    return decide(snap, config, True, explain), decide(snap, config, False, explain)


def _count_fused(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the jobs `_start_single` starts from now on (the list fills as it does)."""
    return count_successes(monkeypatch, backfill_module._Backfill, "_start_single")


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_clusters_start_single_tasks_as_the_long_way(
    policy: str, explain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _count_fused(monkeypatch)
    for seed in range(150):
        snap = random_snapshot(random.Random(seed))
        fused, long_way = _both_ways(snap, POLICIES[policy], explain)
        assert fused == long_way, f"seed {seed}"
    if policy in ("default", "easy"):  # (the others start their jobs before backfill)
        assert len(started) > 20


@FAST
@given(clusters(), CONFIGS, st.booleans())
def test_any_cluster_starts_single_tasks_as_the_long_way(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    fused, long_way = _both_ways(snap, config, explain)
    assert fused == long_way


@FAST
@given(alike_clusters(), CONFIGS, st.booleans())
def test_alike_clusters_start_single_tasks_as_the_long_way(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    fused, long_way = _both_ways(snap, config, explain)
    assert fused == long_way


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("config", sorted(CASE_CONFIGS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_built_clusters_start_single_tasks_as_the_long_way(
    case: str, config: str, explain: bool
) -> None:
    snap = CASES[case]()  # (one snapshot for both: task ids come from a counter)
    fused, long_way = _both_ways(snap, CASE_CONFIGS[config], explain)
    assert fused == long_way


def _selectors_and_reservation() -> Snapshot:
    """One-task jobs of the same shape whose selectors are equal but different dicts, and
    of the same request with other selectors, beside EASY's reservation: jobs that end
    before its start (the plan carried) and jobs that run past it (its spare taken)."""
    nodes = [
        node("e0", gpus=4, cpu=8, labels={"zone": "east", "rack": "1"}),
        node("e1", gpus=4, cpu=8, labels={"zone": "east", "rack": "2"}),
        node("w0", gpus=4, cpu=8, labels={"zone": "west", "rack": "1"}),
        node("c0", gpus=0, cpu=8),
    ]
    jobs = [
        job(1, cpu=4, gpu=3, running_on=[("e0", (0, 1, 2))], walltime=1000.0),
        job(2, cpu=4, gpu=3, running_on=[("w0", (0, 1, 2))], walltime=3000.0),
        job(3, cpu=6, gpu=4, replicas=2, walltime=600.0),  # blocked: the holder
    ]
    for i in range(4, 20):
        selector = [{"zone": "east"}, {"rack": "1", "zone": "east"}, {}, {"zone": "west"}][i % 4]
        jobs.append(
            job(i, cpu=1, gpu=i % 3 % 2, selector=dict(selector) or None,
                walltime=(60.0, 7200.0, None)[i % 3])
        )  # fmt: skip
    return snapshot(nodes, jobs)


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("config", sorted(CASE_CONFIGS))
def test_equal_selectors_and_the_reservation_as_the_long_way(config: str, explain: bool) -> None:
    snap = _selectors_and_reservation()
    fused, long_way = _both_ways(snap, CASE_CONFIGS[config], explain)
    assert fused == long_way


def test_the_cases_take_the_fused_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused start places jobs in the hand-built cases under EASY, around the
    reservation and before it, so the comparisons above compare something."""
    started = _count_fused(monkeypatch)
    decide(_selectors_and_reservation(), POLICIES["easy"], True, False)
    assert len(started) >= 5
    started.clear()
    for snap in CASES.values():
        decide(snap(), POLICIES["easy"], True, False)
    assert len(started) >= 10
