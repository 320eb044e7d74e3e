"""The cold cycle's shortcuts of 2026-11-27 (branch `cold`, docs/benchmarks.md) decide as the
long way does:

- enqueue makes every candidate's alike key in snapshot order (`prefill_alike_keys`), and
  `alike_key` keeps one object per distinct key (`_interned_one`);
- backfill hands `place` the gang size and shape from the job's alike key, rather than
  `place` looking them up again;
- the binpack order keeps each list of label groups' `scan_buckets` per request
  (`BinpackPlugin._scans`);
- enqueue asks whether each candidate has a pending task in snapshot order and reads the
  answers by position in key order (`Session.key_order`);
- `explain` finds the nodes nominated for a preempting job by position
  (`Session._nominated_marks`), not by asking each eligible node.

Each cluster runs a cycle with the first three and with them undone, and needs the same
outcome (`test_single_at_once.outcome`: binds, statuses, failures, evictions, free resources
per node, queue holdings, session version), enqueue admits as the one-by-one loop did, and
`_short_of` says what the test per node says; what makes each right is checked on its own."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import backfill as backfill_module
from scheduler.core import session as session_module
from scheduler.core.actions import enqueue
from scheduler.core.cycle import run_actions
from scheduler.core.model import JobInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import BinpackPlugin, default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session, task_shape
from scheduler.core.types import LabelGroup
from tests.core.builders import POLICIES
from tests.core.test_alike_at_once import random_snapshot
from tests.core.test_alike_refusals import alike_clusters
from tests.core.test_properties import CONFIGS, FAST, clusters
from tests.core.test_single_at_once import outcome


def _cycle(snap: Snapshot, config: SchedulingPolicy, explain: bool) -> tuple[Session, Any]:
    session = Session(snap, config, default_plugins(config), explain=explain)
    return session, run_actions(session)


def _long_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo the three shortcuts: no keys made ahead, no key shared, `place` looks the gang
    size and shape up itself (and backfill starts no job by `_start_single`, which reads
    them from the key too), the binpack order asks every group each time."""
    monkeypatch.setattr(Session, "prefill_alike_keys", lambda self, jobs: None)
    monkeypatch.setattr(Session, "_interned_one", lambda self, value: value)
    try_ = backfill_module._Backfill._try

    def without_key(self: Any, job: JobInfo, reservation: Any, fits: Any, key: Any = None) -> None:
        try_(self, job, reservation, fits)

    monkeypatch.setattr(backfill_module._Backfill, "_try", without_key)
    # (and no job started by `_start_single`, which reads the key too)
    monkeypatch.setattr(backfill_module._Backfill, "_start_single", lambda self, *args: False)

    def every_time(self: BinpackPlugin, request: Resources, groups: list[LabelGroup]) -> Any:
        return [group.scan_buckets(request) for group in groups]

    monkeypatch.setattr(BinpackPlugin, "_scans", every_time)


def _both_ways(snap: Snapshot, config: SchedulingPolicy, explain: bool) -> tuple[Any, Any]:
    fast = outcome(*_cycle(snap, config, explain))
    with pytest.MonkeyPatch.context() as monkeypatch:
        _long_way(monkeypatch)
        slow = outcome(*_cycle(snap, config, explain))
    return fast, slow


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_clusters_decide_as_the_long_way(policy: str, explain: bool) -> None:
    placed = 0
    for seed in range(120):
        snap = random_snapshot(random.Random(seed))
        fast, slow = _both_ways(snap, POLICIES[policy], explain)
        assert fast == slow, f"seed {seed}"
        placed += len(fast[0])
    assert placed > 100


@FAST
@given(clusters(), CONFIGS, st.booleans())
def test_any_cluster_decides_as_the_long_way(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    fast, slow = _both_ways(snap, config, explain)
    assert fast == slow


@FAST
@given(alike_clusters(), CONFIGS, st.booleans())
def test_alike_clusters_decide_as_the_long_way(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    fast, slow = _both_ways(snap, config, explain)
    assert fast == slow


def _key_from_scratch(session: Session, job: JobInfo) -> tuple[Any, ...] | None:
    """A job's alike key as its definition says, from its tasks (not from any cache)."""
    pending = [t for t in job.tasks if t.state == "Pending"]
    shapes = {task_shape(t) for t in pending}
    if len(shapes) != 1:
        return None
    owner = job.owner if job.queue in session.user_limited else ""
    need = session.need.get(job.id, job.min_available)
    return (shapes.pop(), job.queue, need, owner)


@FAST
@given(alike_clusters(), CONFIGS)
def test_kept_keys_are_the_keys_from_scratch_one_object_each(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    """After a cycle, each key kept (made ahead by enqueue or later) is the job's key from
    its tasks, its gang size is `needed` and its shape `shape` (what backfill hands
    `place`), and equal keys are one object."""
    session, _result = _cycle(snap, config, True)
    seen: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for job in session.candidates:
        key = session.alike_key(job)
        assert key == _key_from_scratch(session, job)
        if key is None:
            continue
        assert key[2] == session.needed(job) and key[0] == session.shape(job)
        assert seen.setdefault(key, key) is key


def test_interned_keys_stay_equal_once_forgotten() -> None:
    """Past 4096 distinct keys the shared objects are forgotten: a key made after is equal
    to, not the same object as, one made before; nothing else changes."""
    session = Session(random_snapshot(random.Random(1)), SchedulingPolicy(), [])
    first = session._interned_one((1, "q", 1, ""))
    for i in range(4096):
        session._interned_one((i + 2, "q", 1, ""))
    again = session._interned_one((1, "q", 1, ""))
    assert again == first
    assert len(session._interned) <= 4096


def test_binpack_asks_the_groups_again_once_the_index_is_rebuilt() -> None:
    """The kept `scan_buckets` belong to one list of groups: a session whose index is
    rebuilt (new groups, new buckets) gets its own, never the old ones."""
    snap = random_snapshot(random.Random(3))
    config = SchedulingPolicy()
    plugins = default_plugins(config)
    binpack = next(p for p in plugins if isinstance(p, BinpackPlugin))
    session = Session(snap, config, plugins)
    request = Resources(1, 1, 0)
    groups = session._matching_groups({})
    assert binpack._scans(request, groups) == [g.scan_buckets(request) for g in groups]
    session.index_dirty = True
    session.begin_cycle(session.now)
    new_groups = session._matching_groups({})
    assert new_groups is not groups
    scans = binpack._scans(request, new_groups)
    assert all(s is g.scan_buckets(request) for s, g in zip(scans, new_groups, strict=True))
    old = [id(g.scan_buckets(request)) for g in groups]
    assert not any(id(s) in old for s in scans)


def test_binpack_keeps_the_scans_of_each_request_apart() -> None:
    """A request below the groups' floor scans every node (`buckets`), one at it or above
    only the roomy ones, whichever was asked first of the same groups."""
    groups = [LabelGroup({}, floor=(1000, 1 << 30)), LabelGroup({"zone": "a"}, (1000, 1 << 30))]
    small, roomy = Resources(500, 1 << 30, 0), Resources(1000, 1 << 30, 0)
    for first, second in ((small, roomy), (roomy, small)):
        binpack = BinpackPlugin()
        for request in (first, second, first):
            scans = binpack._scans(request, groups)
            assert all(s is g.scan_buckets(request) for s, g in zip(scans, groups, strict=True))
    assert groups[0].scan_buckets(small) is not groups[0].scan_buckets(roomy)


def _enqueue_one_by_one(session: Session) -> None:
    """Enqueue as it was before it read each job's pending tasks by position: job by job
    in key order."""
    for job in sorted(session.candidates, key=session.job_key):
        invalid = session.job_valid(job)
        if invalid is None:
            if session.pending_tasks(job):
                session.queues[job.queue].jobs.append(job)
            continue
        session.set_pending(job, invalid)


def _admitted(session: Session) -> tuple[Any, ...]:
    queues = {name: [j.id for j in q.jobs] for name, q in session.queues.items()}
    return queues, list(session.pending.items())


@FAST
@given(st.one_of(alike_clusters(), clusters()), CONFIGS)
def test_enqueue_admits_as_job_by_job(snap: Snapshot, config: SchedulingPolicy) -> None:
    """The same jobs in each queue, in the same order, and the same statuses in the same
    order as the one-by-one loop."""
    fast = Session(snap, config, default_plugins(config))
    enqueue(fast)
    slow = Session(snap, config, default_plugins(config))
    _enqueue_one_by_one(slow)
    assert _admitted(fast) == _admitted(slow)


def _short_of_both_ways(session: Session, rng: random.Random) -> int:
    """For each pending task asking whole devices: `_short_of` with the nominated nodes
    found by position (`_nominated_marks`) says what the test per node says
    (`_node_reasons`), for nominated sets of every size (some names of no node); how many
    were compared."""
    names = [n.name for n in session.nodes] + ["ghost"]
    compared = 0
    for job in session.candidates:
        for task in session.pending_tasks(job):
            if task.gpu_share:
                continue
            eligible = session.eligible_nodes(job, task)
            positions = session._static_reasons(job, task)[1]
            for size in (0, 1, 3, 65, 200):
                session.nominated = set(rng.choices(names, k=size))
                marks = session._nominated_marks(eligible, positions)
                shorts = session._shortfalls(eligible, task.resources)
                fast = session_module._short_of(shorts, eligible, positions, marks)
                assert fast == session._node_reasons(task, eligible, positions)
                compared += 1
    return compared


def test_nominated_nodes_found_by_position_as_by_asking_each() -> None:
    compared = 0
    for seed in range(60):
        rng = random.Random(seed)
        snap = random_snapshot(rng)
        if seed % 3 == 0:  # two nodes of one name: both are nominated by it
            snap.nodes.append(replace(snap.nodes[0]))
        config = POLICIES[sorted(POLICIES)[seed % len(POLICIES)]]
        session, _result = _cycle(snap, config, True)  # (free resources of every kind)
        compared += _short_of_both_ways(session, rng)
    assert compared > 500
