"""MIG instances in the cycle: table-driven cases and properties (scheduler/core/sharing.py).

A MIG request goes only on a free instance of exactly its profile, never on a whole or
shared device; a GPU in MIG mode is never given whole or shared."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.status import Code
from scheduler.core.types import Bind
from tests.core.builders import job, mig_uuid, node, snapshot

TS = ("timeslice",)
A, B = "1g.10gb", "2g.20gb"


@dataclass
class Case:
    name: str
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    # job -> (node, devices, instance) it is bound to; jobs left out must not be bound
    binds: dict[int, tuple[str, tuple[int, ...], str]]
    pending: dict[int, str] = field(default_factory=dict)  # job -> code
    reasons: dict[int, str] = field(default_factory=dict)  # job -> text in its message
    actions: tuple[str, ...] = ("enqueue", "allocate")
    queues: list[QueueInfo] | None = None


CASES = [
    Case(
        "a profile takes the first free instance of exactly that profile",
        [node("a", gpus=1, mig={0: [B, A, A]})],
        [job(1, mig=A)],
        {1: ("a", (0,), mig_uuid("a", 0, 1))},
    ),
    Case(
        "an instance held is not given again",
        [node("a", gpus=1, mig={0: [A, A]})],
        [job(1, mig=A, running_on=[("a", (0,))], instances=[mig_uuid("a", 0, 0)]), job(2, mig=A)],
        {2: ("a", (0,), mig_uuid("a", 0, 1))},
    ),
    Case(
        "no free instance of the profile: it waits for resources",
        [node("a", gpus=1, mig={0: [A, B]})],
        [job(1, mig=A, running_on=[("a", (0,))], instances=[mig_uuid("a", 0, 0)]), job(2, mig=A)],
        {},
        {2: Code.WAITING_FOR_RESOURCES},
        reasons={2: "insufficient gpu"},
    ),
    Case(
        "a profile no node has never fits, saying which",
        [node("a", gpus=1, mig={0: [A]}), node("b", gpus=2, sharing=TS)],
        [job(1, mig=B)],
        {},
        {1: Code.NEVER_FITS},
        reasons={1: "2 no MIG instance 2g.20gb"},
    ),
    Case(
        "a MIG GPU is never given whole, nor shared; the other GPU is",
        [node("a", gpus=2, sharing=TS, mig={0: [A]})],
        [job(1, gpu=1), job(2, gpu=1), job(3, share=250)],
        {1: ("a", (1,), "")},
        {2: Code.WAITING_FOR_RESOURCES},
    ),
    Case(
        "a node whose GPUs are all MIG takes no whole GPU, ever",
        [node("a", gpus=1, mig={0: [A]})],
        [job(1, gpu=1)],
        {},
        {1: Code.NEVER_FITS},
    ),
    Case(
        "a profile never goes on a non-MIG device, shared or whole",
        [node("a", gpus=2, sharing=TS)],
        [job(1, share=250, running_on=[("a", (0,))]), job(2, mig=A)],
        {},
        {2: Code.NEVER_FITS},
        reasons={2: "no MIG instance 1g.10gb"},
    ),
    Case(
        "a queue that does not allow mig keeps its jobs off MIG instances",
        [node("a", gpus=1, mig={0: [A]})],
        [job(1, mig=A, modes=("mps",))],
        {},
        {1: Code.NEVER_FITS},
        reasons={1: "GPU sharing mode not allowed by the queue"},
    ),
    Case(
        "a gang of instances takes distinct instances across GPUs",
        [node("a", gpus=2, mig={0: [A], 1: [A, B]})],
        [job(1, mig=A, replicas=2)],
        {1: ("a", (0,), mig_uuid("a", 0, 0))},  # (and the other task below)
    ),
    Case(
        "a profile waiting for an instance holds no node: a whole GPU still starts beside it",
        [node("a", gpus=2, mig={0: [A]})],
        [
            job(1, mig=A, running_on=[("a", (0,))], instances=[mig_uuid("a", 0, 0)], priority=0),
            job(2, mig=A, priority=5),
            job(3, gpu=1),
        ],
        {3: ("a", (1,), "")},
        {2: Code.RESERVED},
        actions=SchedulingPolicy().actions,
    ),
    Case(
        "a gang asking more instances than exist never fits",
        [node("a", gpus=1, mig={0: [A, A]})],
        [job(1, mig=A, replicas=3)],
        {},
        {1: Code.NEVER_FITS},
    ),
]


def _bound(result: CycleResult) -> dict[int, list[tuple[str, tuple[int, ...], str]]]:
    bound: dict[int, list[tuple[str, tuple[int, ...], str]]] = {}
    for b in result.binds:
        bound.setdefault(b.job_id, []).append((b.node, b.devices, b.instance))
    return bound


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_it_places_mig_instances(case: Case) -> None:
    config = SchedulingPolicy(actions=case.actions)
    result = run_cycle(snapshot(case.nodes, case.jobs, case.queues), config)
    bound = _bound(result)
    assert {j: b[0] for j, b in bound.items()} == case.binds
    for job_id, code in case.pending.items():
        assert result.pending[job_id].code == code, result.pending[job_id]
    for job_id, text in case.reasons.items():
        assert text in result.pending[job_id].message, result.pending[job_id]


def test_a_gang_holds_two_different_instances() -> None:
    nodes = [node("a", gpus=2, mig={0: [A], 1: [A, B]})]
    result = run_cycle(snapshot(nodes, [job(1, mig=A, replicas=2)]), SchedulingPolicy())
    assert sorted(b.instance for b in result.binds) == [mig_uuid("a", 0, 0), mig_uuid("a", 1, 0)]
    assert sorted(b.devices for b in result.binds) == [(0,), (1,)]


def test_it_counts_an_instance_in_drf_as_its_slices() -> None:
    """A queue holding a 1g instance (1/7 GPU) is served before one holding a whole GPU."""
    queues = [QueueInfo("q1"), QueueInfo("q2")]
    nodes = [node("a", gpus=3, cpu=64, mig={0: [A, A]})]
    jobs = [
        job(1, mig=A, queue="q1", cpu=0.5, running_on=[("a", (0,))],
            instances=[mig_uuid("a", 0, 0)]),
        job(2, gpu=1, queue="q2", cpu=0.5, running_on=[("a", (1,))]),
        job(3, gpu=1, queue="q2", cpu=0.5, created_at=1.0),
        job(4, mig=A, queue="q1", cpu=0.5, created_at=2.0),
    ]  # fmt: skip
    result = run_cycle(
        snapshot(nodes, jobs, queues), SchedulingPolicy(actions=("enqueue", "allocate"))
    )
    assert [b.job_id for b in result.binds] == [4, 3]


# --- properties ---------------------------------------------------------------------------

PROFILES = [A, B, "3g.40gb"]
asks = st.one_of(
    st.tuples(st.just("mig"), st.sampled_from(PROFILES)),
    st.tuples(st.just("share"), st.sampled_from([100, 250, 500])),
    st.tuples(st.just("whole"), st.integers(1, 2)),
)
layouts = st.lists(
    st.one_of(st.none(), st.lists(st.sampled_from(PROFILES), min_size=1, max_size=4)),
    min_size=1,
    max_size=3,
)


def _cluster(draw_layouts: list[list[list[str] | None]]) -> list[NodeInfo]:
    nodes = []
    for n, layout in enumerate(draw_layouts):
        mig = {i: profiles for i, profiles in enumerate(layout) if profiles}
        nodes.append(node(f"n{n}", gpus=len(layout), cpu=64, sharing=TS, mig=mig))
    return nodes


def _jobs(requests: list[tuple[str, object]]) -> list[JobInfo]:
    jobs = []
    for i, (kind, value) in enumerate(requests, start=1):
        if kind == "mig":
            jobs.append(job(i, mig=str(value), cpu=0.1))
        elif kind == "share":
            jobs.append(job(i, share=int(str(value)), cpu=0.1))
        else:
            jobs.append(job(i, gpu=int(str(value)), cpu=0.1))
    return jobs


def _run(nodes: list[NodeInfo], jobs: list[JobInfo], cycles: int) -> list[JobInfo]:
    snap = snapshot(nodes, jobs)
    for _ in range(cycles):
        result = run_cycle(snap, SchedulingPolicy(strict_order=False))
        by_task = {b.task_id: b for b in result.binds}
        snap = replace(snap, jobs=[_placed(j, by_task) for j in snap.jobs])
    return snap.jobs


def _placed(j: JobInfo, by_task: dict[int, Bind]) -> JobInfo:
    tasks = []
    for t in j.tasks:
        b = by_task.get(t.id)
        if b is None:
            tasks.append(t)
            continue
        tasks.append(replace(t, state="Running", node=b.node, devices=b.devices,
                             gpu_instance=b.instance, started_at=0.0))  # fmt: skip
    running = any(t.node for t in tasks)
    return replace(j, tasks=tasks, state="Running" if running else j.state)


@settings(max_examples=60, deadline=None)
@given(layouts=st.lists(layouts, min_size=1, max_size=3), requests=st.lists(asks, max_size=12))
def test_no_instance_is_held_twice_and_mig_stays_apart(
    layouts: list[list[list[str] | None]], requests: list[tuple[str, object]]
) -> None:
    nodes = _cluster(layouts)
    jobs = _run(nodes, _jobs(requests), cycles=2)
    instances = {
        (n.name, d.index): {m.uuid: m.profile for m in d.mig} for n in nodes for d in n.devices
    }
    held: Counter[str] = Counter()
    for j in jobs:
        for t in j.tasks:
            if not t.node:
                continue
            on_mig = [bool(instances[(t.node, d)]) for d in t.devices]
            if t.gpu_mig:  # only on an instance of its own profile, of its own device
                assert len(t.devices) == 1 and on_mig == [True]
                assert instances[(t.node, t.devices[0])][t.gpu_instance] == t.gpu_mig
                held[t.gpu_instance] += 1
            else:  # whole GPUs and fractions never on a MIG GPU
                assert not any(on_mig) and not t.gpu_instance
    assert all(count == 1 for count in held.values()), held
