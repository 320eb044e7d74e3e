"""Fractions of a GPU in the cycle: table-driven cases (scheduler/core/sharing.py)."""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field, replace

import pytest

from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.standing import StandingSession
from scheduler.core.status import Code
from tests.core.builders import NOW, job, node, snapshot

TS = ("timeslice",)


@dataclass
class Case:
    name: str
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    # job -> (node, devices) it is bound to; jobs left out must not be bound
    binds: dict[int, tuple[str, tuple[int, ...]]]
    pending: dict[int, str] = field(default_factory=dict)  # job -> code
    placement: str = "fgd"
    reasons: dict[int, str] = field(default_factory=dict)  # job -> text in its message
    strict: bool = True
    actions: tuple[str, ...] = SchedulingPolicy().actions


CASES = [
    Case(
        "four quarters share one device; a whole GPU takes the other",
        [node("a", gpus=2, sharing=TS)],
        [*(job(i, share=250) for i in range(1, 5)), job(5, gpu=1)],
        {1: ("a", (0,)), 2: ("a", (0,)), 3: ("a", (0,)), 4: ("a", (0,)), 5: ("a", (1,))},
    ),
    Case(
        "a whole GPU waits while its only device holds a fraction",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=500, running_on=[("a", (0,))]), job(2, gpu=1)],
        {},
        {2: Code.RESERVED},  # until the fraction's walltime: its device comes back whole then
        reasons={2: "expected to start in 3500s"},
    ),
    Case(
        "a fraction never goes past a device's free share",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=700, running_on=[("a", (0,))]), job(2, share=400), job(3, share=300)],
        {3: ("a", (0,))},
        {2: Code.RESERVED},
        strict=False,
    ),
    Case(
        "a fraction never goes on a device held whole",
        [node("a", gpus=2, sharing=TS)],
        [job(1, gpu=1, running_on=[("a", (0,))]), job(2, share=250)],
        {2: ("a", (1,))},
    ),
    Case(
        "no fraction on a node without GPU sharing",
        [node("a", gpus=2)],
        [job(1, share=250)],
        {},
        {1: Code.NEVER_FITS},
        reasons={1: "no GPU sharing"},
    ),
    Case(
        "the queue's modes must meet the node's",
        [node("a", gpus=1, sharing=("mps",)), node("b", gpus=1, sharing=TS)],
        [job(1, share=250, modes=("timeslice",))],
        {1: ("b", (0,))},
    ),
    Case(
        "nodes alike but for their sharing are told apart",
        [node("a", gpus=1), node("b", gpus=1, sharing=TS)],
        [job(1, share=900, running_on=[("b", (0,))]), job(2, share=250)],
        {},
        {2: Code.WAITING_FOR_RESOURCES},
        reasons={2: "1 insufficient gpu, 1 no GPU sharing"},
        actions=("enqueue", "allocate"),
    ),
    Case(
        "gpu memory: only a device with that much left",
        [node("a", gpus=2, sharing=TS, gpu_memory_gi=16)],
        [
            job(1, share=250, gpu_memory_gi=12, running_on=[("a", (0,))]),
            job(2, share=250, gpu_memory_gi=8),
        ],  # fmt: skip
        {2: ("a", (1,))},
    ),
    Case(
        "gpu memory above every device never fits",
        [node("a", gpus=2, sharing=TS, gpu_memory_gi=16)],
        [job(1, share=250, gpu_memory_gi=20)],
        {},
        {1: Code.NEVER_FITS},
        reasons={1: "insufficient gpu memory"},
    ),
    Case(
        "best fit: the fullest device that still has room",
        [node("a", gpus=3, sharing=TS)],
        [
            job(1, share=500, running_on=[("a", (0,))]),
            job(2, share=250, running_on=[("a", (1,))]),
            job(3, share=500),
        ],  # fmt: skip
        {3: ("a", (0,))},
        placement="best-fit",
    ),
    Case(
        "first fit: the first device with room",
        [node("a", gpus=3, sharing=TS)],
        [job(1, share=500, running_on=[("a", (1,))]), job(2, share=500)],
        {2: ("a", (0,))},
        placement="first-fit",
    ),
    Case(
        "fgd: fill a shared device before opening a whole one",
        [node("a", gpus=2, sharing=TS), node("b", gpus=2, sharing=TS), node("c", gpus=1)],
        # (whole GPUs are part of the workload: a device left half full would waste them)
        [
            job(1, share=500, running_on=[("b", (1,))]),
            job(2, share=500),
            job(3, gpu=1, running_on=[("c", (0,))]),
        ],  # fmt: skip
        {2: ("b", (1,))},
    ),
    Case(
        "a gang of fractions that could never fit on the devices",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=400, replicas=3)],
        {},
        {1: Code.NEVER_FITS},
    ),
    Case(
        "a gang of fractions starts whole or not at all",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=200, running_on=[("a", (0,))]), job(2, share=300, replicas=3)],
        {},
        {2: Code.GANG_INCOMPLETE},
        actions=("enqueue", "allocate"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_it_places_fractions(case: Case) -> None:
    config = SchedulingPolicy(
        gpu_placement=case.placement, strict_order=case.strict, actions=case.actions
    )
    result = run_cycle(snapshot(case.nodes, case.jobs), config)
    bound = {b.job_id: (b.node, b.devices) for b in result.binds}
    assert bound == case.binds
    for job_id, code in case.pending.items():
        assert result.pending[job_id].code == code, result.pending[job_id]
    for job_id, text in case.reasons.items():
        assert text in result.pending[job_id].message


def test_it_never_packs_past_a_whole_device_over_cycles() -> None:
    """Cycle after cycle, what each device holds adds up to at most one GPU."""
    nodes = [node("a", gpus=2, sharing=TS), node("b", gpus=1, sharing=TS)]
    shares = [300, 500, 250, 700, 100, 400, 250, 600, 150, 1000]
    jobs = [job(i + 1, share=s) if s < 1000 else job(i + 1, gpu=1) for i, s in enumerate(shares)]
    snap = snapshot(nodes, jobs)
    for _ in range(3):
        snap = replace(snap, jobs=_apply(snap.jobs, run_cycle(snap)))
    held: dict[tuple[str, int], int] = defaultdict(int)
    for j in snap.jobs:
        for t in j.tasks:
            for d in t.devices:
                held[(t.node or "", d)] += t.gpu_share or 1000
    assert held and max(held.values()) <= 1000
    whole = {
        (t.node, t.devices[0]) for j in snap.jobs for t in j.tasks if t.devices and not t.gpu_share
    }
    shared = {(t.node, t.devices[0]) for j in snap.jobs for t in j.tasks if t.gpu_share and t.node}
    assert not whole & shared


def _apply(jobs: list[JobInfo], result: CycleResult) -> list[JobInfo]:
    by_task = {b.task_id: b for b in result.binds}
    out = []
    for j in jobs:
        tasks = [
            replace(t, state="Running", node=by_task[t.id].node, devices=by_task[t.id].devices,
                    started_at=0.0) if t.id in by_task else t
            for t in j.tasks
        ]  # fmt: skip
        out.append(
            replace(j, tasks=tasks, state="Running" if any(t.node for t in tasks) else j.state)
        )
    return out


def test_it_counts_fractions_in_drf_as_what_they_are() -> None:
    """A queue holding a quarter GPU has a smaller share than one holding a whole GPU: the
    next fraction goes to the queue holding less."""
    queues = [QueueInfo("q1"), QueueInfo("q2")]
    nodes = [node("a", gpus=4, sharing=TS, cpu=64)]
    jobs = [
        job(1, share=250, queue="q1", cpu=0.5, running_on=[("a", (0,))]),
        job(2, gpu=1, queue="q2", cpu=0.5, running_on=[("a", (1,))]),
        job(3, share=1, queue="q2", cpu=0.5, created_at=1.0),
        job(4, share=1, queue="q1", cpu=0.5, created_at=2.0),
    ]
    config = SchedulingPolicy(actions=("enqueue", "allocate"))
    result = run_cycle(snapshot(nodes, jobs, queues), config)
    assert [b.job_id for b in result.binds] == [4, 3]  # q1 (0.25 GPU) served first


def test_a_fraction_placed_this_cycle_keeps_the_shared_device_from_a_reservation() -> None:
    """The device's only occupant is past its walltime, so its end would give the device
    back whole now; a fraction placed on the device this cycle (no walltime) holds it from
    then on, so the whole-GPU job reserved after it is not promised the device now (as it
    was before: "expected to start in 0s", then delayed by the fraction)."""
    nodes = [node("a", gpus=1, sharing=TS)]
    jobs = [
        job(1, share=250, walltime=50.0, running_on=[("a", (0,))], started_at=NOW - 100),
        job(2, share=250, walltime=None, created_at=1.0),
        job(3, gpu=1, walltime=None, created_at=2.0),
    ]
    config = SchedulingPolicy(actions=("enqueue", "allocate", "backfill"))
    result = run_cycle(snapshot(nodes, jobs), config)
    assert [(b.job_id, b.node, b.devices) for b in result.binds] == [(2, "a", (0,))]
    reserved = result.pending[3]
    assert reserved.code == Code.RESERVED
    assert reserved.estimated_start is None, reserved.message


def test_a_standing_session_gives_a_shared_device_back_at_its_last_occupants_end() -> None:
    """Two fractions start on one device in two cycles, then a whole-GPU job waits: it is
    promised the device when the later of the two ends, as a full cycle on the same
    snapshot promises it (not when the first ends, nor never)."""
    nodes = [node("a", gpus=1, sharing=TS)]
    standing = StandingSession(nodes, [QueueInfo("default")], SchedulingPolicy.easy(), True)
    first = job(1, share=250, walltime=100.0, preemptible=False, created_at=1.0)
    second = job(2, share=250, walltime=1000.0, preemptible=False, created_at=2.0)
    whole = job(3, gpu=1, walltime=50.0, preemptible=False, created_at=3.0)
    standing.submit(first)
    standing.cycle(0.0)
    standing.submit(second)
    standing.cycle(10.0)
    assert second.tasks[0].devices == (0,)  # on the first one's device
    snap = snapshot(nodes, copy.deepcopy([first, second, whole]), now=20.0)
    standing.submit(whole)
    promised = standing.cycle(20.0).pending[3]
    assert promised.code == Code.RESERVED
    assert promised.estimated_start == 1010.0
    assert run_cycle(snap, SchedulingPolicy.easy()).pending[3].estimated_start == 1010.0
    # The later one ends early: the device comes back at the other one's end.
    standing.finish(2)
    again = snapshot(nodes, copy.deepcopy([first, whole]), now=30.0)
    assert standing.cycle(30.0).pending[3].estimated_start == 100.0
    assert run_cycle(again, SchedulingPolicy.easy()).pending[3].estimated_start == 100.0
