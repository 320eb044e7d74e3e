"""The cycle's incremental shortcuts decide exactly what working it out from scratch does.

Three things are kept up to date instead of being worked out again (issue #21, "Fast"):
each label group's `roomy` buckets (the nodes with at least the session's floor of cpu and
memory free, in bucket order), the static node reasons counted once per task shape for
`explain`, and the per-node sums preempt uses to tell whether a one-run gang fits. Each
property runs a cycle both ways on random clusters and needs every decision, status and
node reason (in order) to be the same, or checks the kept structure against a fresh one
after every change.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import actions, sharing
from scheduler.core import session as session_module
from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.resources import Resources
from scheduler.core.session import Session
from scheduler.core.types import LabelGroup
from tests.core.builders import job, node
from tests.core.test_properties import CONFIGS, FAST, clusters


def _decisions(result: CycleResult) -> tuple[Any, ...]:
    statuses = sorted(
        (job_id, s.code, s.message, list(s.node_reasons.items()), s.estimated_start)
        for job_id, s in result.pending.items()
    )
    return (result.binds, result.evictions, statuses)


def _explain_from_scratch(
    self: Session, job: JobInfo, task: TaskInfo
) -> tuple[str, bool, dict[str, int]]:
    """`Session.explain` as it was before the per-shape counts: every node asked."""
    if not self.explain_failures:
        return "", bool(self.eligible_nodes(job, task)), {}
    counts: Counter[str] = Counter()
    could_fit = False
    for n in self.nodes:
        reason = self.node_reason(job, task, n)
        if reason is None:
            reason = "reserved for a preempting job" if n.name in self.nominated else ""
            if not reason:
                short = _short_now(task, n)
                reason = f"insufficient {short[0]}" if short else "held for the reservation"
            could_fit = True
        counts[reason] += 1
    parts = ", ".join(f"{c} {r}" for r, c in sorted(counts.items(), key=lambda i: (-i[1], i[0])))
    detail = f"0/{len(self.nodes)} nodes fit: {parts}" if parts else "no nodes"
    return detail, could_fit, dict(counts)


def _short_now(task: TaskInfo, n: Any) -> list[str]:
    """What the node lacks for the task now. A fraction's `gpu` (1) is the device it may
    open: it lacks a GPU only when no device has room for its share (`sharing.options`,
    where placement puts it), not when no device is whole and free."""
    short = task.resources.short_of(n.free())
    if task.gpu_share:
        short = [d for d in short if d != "gpu"] + ([] if sharing.options(n, task) else ["gpu"])
    return short


def _from_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    """No floor (`roomy` is then every bucket), every node explained, simulate per victim."""
    monkeypatch.setattr(session_module, "request_floor", lambda jobs: (0, 0))
    monkeypatch.setattr(Session, "explain", _explain_from_scratch)
    monkeypatch.setattr(actions._GangRoom, "of", classmethod(lambda cls, s, j, r: None))


def _roomy_is_exact(group: LabelGroup) -> None:
    """`roomy` holds, bucket by bucket and in the bucket's order, exactly the nodes with at
    least the floor free."""
    for free, bucket in group.buckets.items():
        wanted = [
            name
            for name, n in bucket.items()
            if n.free_cpu >= group.floor_cpu and n.free_memory >= group.floor_memory
        ]
        assert list(group.roomy.get(free, {})) == wanted, (free, group.labels)
    assert not set(group.roomy) - set(group.buckets)


@FAST
@given(clusters(), CONFIGS)
def test_the_shortcuts_decide_as_from_scratch(snap: Snapshot, config: SchedulingPolicy) -> None:
    fast = _decisions(run_cycle(snap, config))
    with pytest.MonkeyPatch.context() as monkeypatch:
        _from_scratch(monkeypatch)
        slow = _decisions(run_cycle(snap, config))
    assert fast == slow


@FAST
@given(clusters(), CONFIGS)
def test_roomy_buckets_stay_exact_through_every_change(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    kept = Session._resized

    def resized(self: Session, n: Any) -> None:
        kept(self, n)
        for group in self._groups.values():
            _roomy_is_exact(group)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(Session, "_resized", resized)
        run_cycle(snap, config)


def test_a_node_given_back_rejoins_its_bucket_in_order() -> None:
    """A discarded placement frees a node that had dropped out of `roomy`: it comes back
    where the bucket has it, not at the end."""
    group = LabelGroup({}, floor=(1000, 1))
    views = [session_module.NodeView(node(f"n{i}", gpus=0, cpu=2)) for i in range(3)]
    for view in views:
        group.add(view)
    views[0].free_cpu = 500
    assert not group.resized(views[0])
    assert list(group.roomy[0]) == ["n1", "n2"]
    views[0].free_cpu = 2000
    assert group.resized(views[0])
    assert list(group.roomy[0]) == ["n0", "n1", "n2"]
    _roomy_is_exact(group)


def test_a_task_below_the_floor_scans_every_node() -> None:
    group = LabelGroup({}, floor=(1000, 1 << 30))
    assert group.scan_buckets(Resources(1000, 1 << 30, 0)) is group.roomy
    assert group.scan_buckets(Resources(500, 1 << 30, 0)) is group.buckets
    plain = LabelGroup({})
    assert plain.roomy is plain.buckets


@given(
    st.lists(st.tuples(st.integers(-2, 9), st.integers(-2, 9), st.integers(-1, 5)), max_size=8),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2)),
    st.integers(1, 6),
    st.lists(st.tuples(st.integers(0, 7), st.integers(-3, 3)), max_size=10),
)
def test_gang_room_sums_say_what_simulate_says(
    rooms: list[tuple[int, int, int]],
    request: tuple[int, int, int],
    count: int,
    changes: list[tuple[int, int]],
) -> None:
    """For a gang of `count` alike tasks, `_GangRoom.enough` is True exactly when first fit
    (`simulate`) places it, as the room changes node by node."""
    nodes = [node(f"n{i}", gpus=8, cpu=16, memory_gi=16) for i in range(len(rooms))]
    gang = job(1, cpu=request[0] / 1000, memory_gi=0, gpu=request[2], replicas=count)
    for task in gang.tasks:
        task.resources = Resources(*request)
    snap = Snapshot(0.0, nodes, [], [gang])
    session = Session(snap, SchedulingPolicy(), [])
    room = {f"n{i}": Resources(*r) for i, r in enumerate(rooms)}
    fits = actions._GangRoom.of(session, gang, room)
    assert fits is not None
    assert fits.enough() == (actions.simulate(session, gang, room) is not None)
    for index, delta in changes:
        name = f"n{index}"
        if name not in room:
            continue
        room[name] = room[name] + Resources(delta, delta, delta)
        fits.changed(name, room[name])
        assert fits.enough() == (actions.simulate(session, gang, room) is not None)


def _across_queues_by_heap(session: Session, cursors: dict[str, Any]) -> Any:
    """The order as it was before a queue was served again without the heap."""

    def key(name: str) -> tuple[object, ...]:
        return session.queue_key(session.queues[name])

    heap = [(key(name), name) for name in cursors]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        job = next(cursors[name], None)
        if job is None:
            continue
        yield job
        heapq.heappush(heap, (key(name), name))


@FAST
@given(clusters(), CONFIGS)
def test_queues_are_served_in_the_order_the_heap_gives(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    """A queue whose key did not change after its job is served again at once, without
    going through the heap, and every key is worked out again only when its allocation
    changed: the same jobs in the same order as pushing and popping every queue each time."""
    fast = _decisions(run_cycle(snap, config))
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(actions, "_across_queues", _across_queues_by_heap)
        slow = _decisions(run_cycle(snap, config))
    assert fast == slow
