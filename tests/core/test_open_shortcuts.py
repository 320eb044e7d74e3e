"""Opening a session the short way decides as the long way did: the running tasks' planned
ends worked out in `_load_running`'s one pass and sorted by `sort_ends` (three stable sorts
on one field each) rather than built apart and sorted as tuples, a node's view made in one
pass over its devices, and the cluster's totals summed per dimension. Each is compared with
the code it replaced (`OldSession`, `OldNodeView`, `list.sort`) on random clusters whose
node names are out of order, whose tasks' ids are shuffled (some shared by two tasks), some
of whose jobs share an id, with fractions, MIG instances, Releasing tasks, suspended jobs
and predicted runtimes (`random_snapshot`)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import session as session_module
from scheduler.core.model import DeviceInfo, MigInfo, NodeInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.priority import PriorityWeights
from scheduler.core.resources import Resources
from scheduler.core.session import End, Session, many_equal, sort_ends
from scheduler.core.types import NodeView
from tests.core.test_steady_shortcuts import (
    OldNodeView,
    OldSession,
    decided,
    old_sort_out,
    opened,
    random_snapshot,
)

NAMES = ["n0", "b", "node-10", "node-9", "a1", "zz", "n", "a"]
POLICIES = [
    SchedulingPolicy(),
    SchedulingPolicy(strict_order=False, prediction_correction="stepwise"),
    SchedulingPolicy(priority_weights=PriorityWeights(age=1000, fair_share=10_000, priority=100)),
]


def shuffled_snapshot(seed: int) -> Snapshot:
    """`random_snapshot` with its nodes renamed out of name order, its jobs in another
    order, its tasks' ids shuffled (now and then two tasks sharing one, and tasks starting
    together: equal ends on several nodes) and now and then two jobs sharing an id."""
    rng = random.Random(seed)
    snap = random_snapshot(rng)
    renamed = rng.sample(NAMES, len(snap.nodes))
    names = {n.name: new for n, new in zip(snap.nodes, renamed, strict=True)}
    for n in snap.nodes:
        n.name = names[n.name]
    tasks = [t for j in snap.jobs for t in j.tasks]
    ids = rng.sample(range(1, 4 * len(tasks) + 2), len(tasks))
    if len(tasks) > 1 and rng.random() < 0.3:
        ids[rng.randrange(len(ids))] = ids[0]
    for task, task_id in zip(tasks, ids, strict=True):
        task.id = task_id
        if task.node is not None:
            task.node = names.get(task.node, task.node)
            if rng.random() < 0.5:
                task.started_at = 9_000.0  # (the walltimes are few: many equal ends)
    rng.shuffle(snap.jobs)
    if len(snap.jobs) > 2 and rng.random() < 0.2:
        snap.jobs[1] = replace(snap.jobs[1], id=snap.jobs[0].id)
    return snap


def old_opened(snap: Snapshot, policy: SchedulingPolicy, patched: pytest.MonkeyPatch) -> Any:
    patched.setattr(session_module, "_sort_out", old_sort_out)
    patched.setattr(session_module, "NodeView", OldNodeView)
    return opened(OldSession(snap, policy, default_plugins(policy)))


@pytest.mark.parametrize("seed", range(400))
def test_a_session_opens_as_it_did(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = shuffled_snapshot(seed)
    policy = POLICIES[seed % len(POLICIES)]
    session = Session(snap, policy, default_plugins(policy))
    now = opened(session)
    with monkeypatch.context() as patched:
        before = old_opened(snap, policy, patched)
    assert now == before
    total = Resources()  # (the totals as they were summed)
    for n in session.nodes:
        total = total + n.capacity()
    assert session.total == total
    assert session.max_devices == max((n.healthy_devices for n in session.nodes), default=0)


@pytest.mark.parametrize("seed", range(300))
def test_random_clusters_decide_as_they_did(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = shuffled_snapshot(seed)
    policy = POLICIES[seed % len(POLICIES)]
    now = decided(snap, policy)
    with monkeypatch.context() as patched:
        patched.setattr(session_module, "_sort_out", old_sort_out)
        patched.setattr(session_module, "NodeView", OldNodeView)
        patched.setattr("scheduler.core.cycle.Session", OldSession)
        before = decided(snap, policy)
    assert now == before


def test_the_clusters_have_what_the_shortcuts_must_keep() -> None:
    """The clusters above have ends equal on several nodes out of name order, task ids
    shared, fractions and Releasing tasks, so each step of `sort_ends` and its fallback is
    exercised (`fast`: its three sorts)."""
    seen = {"tie": 0, "shared id": 0, "fraction": 0, "releasing": 0, "unordered": 0, "fast": 0}
    for seed in range(400):
        snap = shuffled_snapshot(seed)
        session = Session(snap, POLICIES[0], default_plugins(POLICIES[0]))
        ends = session.walltime_ends
        ids = [e[2] for e in ends]
        seen["shared id"] += len(set(ids)) != len(ids)
        pairs = zip(ends, ends[1:], strict=False)
        seen["tie"] += any(a[0] == b[0] and a[1] != b[1] for a, b in pairs)
        names = [n.name for n in session.nodes]
        seen["unordered"] += names != sorted(names)
        seen["fraction"] += any(t.gpu_share for n in session.nodes for _, t in n.tasks)
        seen["releasing"] += session.releasing > 0
        seen["fast"] += many_equal(ends) and len(set(ids)) == len(ids)
    assert all(count >= 5 for count in seen.values()), seen


# --- sort_ends on its own ----------------------------------------------------------------

ENDS = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from([0.0, -0.0, 1.0, 2.5, 100.0, math.inf, -math.inf]),
            st.integers(-2, 3),
            st.floats(allow_nan=True),
        ),
        st.sampled_from(NAMES + ["", "é", "node-1"]),
        st.integers(0, 30),
        st.integers(0, 5),
        st.builds(Resources, st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    ),
    max_size=60,
)


@given(ENDS)
def test_sort_ends_sorts_as_the_tuples_sort(ends: list[End]) -> None:
    expected = sorted(ends)
    sort_ends(ends)
    assert [tuple(map(repr, e)) for e in ends] == [tuple(map(repr, e)) for e in expected]


@pytest.mark.parametrize("seed", range(200))
def test_sort_ends_on_many_equal_ends(seed: int) -> None:
    """Mostly equal ends over many nodes, as a busy cluster's, with distinct task ids (the
    fast path); then with one id shared and one end NaN (the plain sort)."""
    rng = random.Random(seed)
    ends: list[End] = [
        (
            rng.choice([5.0, 5.0, 5.0, 7.0, 3]),
            f"node-{rng.randrange(40)}",
            task_id,
            rng.randrange(9),
            Resources(rng.randrange(3), 0, rng.randrange(2)),
        )
        for task_id in rng.sample(range(10_000), rng.randrange(1, 300))
    ]
    same = (ends[0][0], ends[0][1], ends[0][2], ends[0][3] + 1, Resources())
    nans = [(math.nan, "node-1", 1, 1, Resources()), (float("nan"), "node-0", 2, 1, Resources())]
    for extra in ([], [same], nans):
        varied = ends + extra
        rng.shuffle(varied)
        got = list(varied)
        sort_ends(got)
        expected = sorted(varied)
        assert all(a is b for a, b in zip(got, expected, strict=True))


# --- a node's view -------------------------------------------------------------------------


def random_node(rng: random.Random) -> NodeInfo:
    devices = []
    for _ in range(rng.randrange(6)):
        mig = tuple(
            MigInfo(rng.choice(["1g.10gb", "2g.20gb"]), f"MIG-{rng.randrange(99)}")
            for _ in range(rng.choice([0, 0, 1, 3]))
        )
        devices.append(
            DeviceInfo(
                rng.randrange(4),  # (now and then two devices with one index)
                model=rng.choice(["", "", "A100", "H100"]),
                healthy=rng.random() < 0.8,
                memory=rng.choice([0, 40, 80]),
                mig=mig,
            )
        )
    labels = rng.choice([{}, {"gpu": "h100"}, {"z": "1", "a": "2"}])
    return NodeInfo("n", Resources(8000, 64, len(devices)), labels, devices=devices)


@pytest.mark.parametrize("seed", range(300))
def test_a_node_view_is_made_as_it_was(seed: int) -> None:
    info = random_node(random.Random(seed))
    new, old = NodeView(info), OldNodeView(info)
    for slot in NodeView.__slots__:
        assert getattr(new, slot) == getattr(old, slot), slot
    assert list(new.device_memory) == list(old.device_memory)
    assert [list(v) for v in new.mig_free.values()] == [list(v) for v in old.mig_free.values()]
    assert list(new.mig_free) == list(old.mig_free)
