"""Fractions and MIG instances where the core sums GPUs (issue #23's open gaps): gangs of
fractions in start estimates and in EASY's reservation, the device a shared GPU's occupants
give back only when they have all really left, and per-user / per-queue GPU limits that
count a fraction as its share and a MIG instance as its slices of seven."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.fit import Ask, over_capability
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plan import plan_starts
from scheduler.core.resources import Resources
from scheduler.core.status import Code
from tests.core.builders import NOW, job, mig_uuid, node, snapshot

TS = ("timeslice",)
ALLOCATE = SchedulingPolicy(actions=("enqueue", "allocate"))
EASY = SchedulingPolicy.easy()


def _releasing(j: JobInfo) -> JobInfo:
    return replace(j, tasks=[replace(t, state="Releasing") for t in j.tasks])


# --- start estimates (scheduler/core/plan.py) ------------------------------------------------


@dataclass
class PlanCase:
    name: str
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    starts: dict[int, float | None]  # job -> estimate, seconds from now (None: unknown)
    config: SchedulingPolicy = ALLOCATE


PLAN_CASES = [
    PlanCase(
        "a gang of four quarters shares one device once it is free",
        [node("a", gpus=1, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, share=250, replicas=4, walltime=500)],
        {2: 900},
    ),
    PlanCase(
        "a gang of two halves needs one device, three halves two",
        [node("a", gpus=2, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=2000, running_on=[("a", (1,))]),
         job(4, share=500, replicas=3, walltime=100, created_at=0.5),
         job(2, share=500, replicas=2, walltime=100, created_at=0.6)],
        {4: 1900, 2: 900},
        SchedulingPolicy(actions=("enqueue", "allocate"), strict_order=False),
    ),
    PlanCase(
        "a gang of fractions with the reservation starts when the core says",
        [node("a", gpus=1, sharing=TS)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, share=250, replicas=4, walltime=500)],
        {2: 900},
        EASY,
    ),
    PlanCase(
        "a shared device whose other occupant is releasing comes back when the last one ends",
        [node("a", gpus=1, sharing=TS)],
        [_releasing(job(1, share=500, walltime=5000, running_on=[("a", (0,))])),
         job(2, share=500, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: 900},
    ),
    PlanCase(
        "a shared device whose other occupant is being suspended comes back at the last end",
        [node("a", gpus=1, sharing=TS)],
        [job(1, share=500, walltime=5000, running_on=[("a", (0,))], suspend_requested=True),
         job(2, share=500, walltime=1000, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: 900},
    ),
    PlanCase(
        "a device shared with an occupant without walltime never comes back",
        [node("a", gpus=1, sharing=TS)],
        [_releasing(job(1, share=500, walltime=5000, running_on=[("a", (0,))])),
         job(2, share=500, walltime=None, running_on=[("a", (0,))]),
         job(3, gpu=1, walltime=100)],
        {3: None},
    ),
    PlanCase(
        "whole GPUs are planned as before",
        [node("a", gpus=2)],
        [job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
         job(2, gpu=1, replicas=2, walltime=500)],
        {2: 900},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.name)
def test_start_estimates(case: PlanCase) -> None:
    snap = snapshot(case.nodes, case.jobs)
    plan = plan_starts(snap, run_cycle(snap, case.config), case.config)
    starts = {j: None if t is None else t - NOW for j, t in plan.starts.items()}
    assert {j: starts.get(j) for j in case.starts} == case.starts


# --- EASY's reservation (scheduler/core/backfill.py) -----------------------------------------


def test_a_gang_of_fractions_holds_a_reservation_that_backfill_does_not_delay() -> None:
    """Eight quarters need two devices: one is free now, the other at 900. A whole-GPU job
    running past 900 would take the free one and delay the gang; one ending before may run."""
    nodes = [node("a", gpus=2, sharing=TS)]
    jobs = [
        job(1, gpu=1, walltime=1000, running_on=[("a", (0,))]),
        job(2, share=250, replicas=8, walltime=500),
        job(3, gpu=1, walltime=5000),
        job(4, gpu=1, walltime=500),
    ]
    result = run_cycle(snapshot(nodes, jobs), EASY)
    assert result.pending[2].code == Code.RESERVED
    assert result.pending[2].estimated_start == NOW + 900
    assert {b.job_id for b in result.binds} == {4}
    assert result.pending[3].code == Code.RESERVED_FOR_OTHER


# --- per-user and per-queue GPU limits -------------------------------------------------------

G1, G3, G4 = "1g.10gb", "3g.40gb", "4g.40gb"


def _mig_node() -> NodeInfo:
    """GPUs 0 and 1 in MIG mode, 2 and 3 shared by fractions."""
    return node("a", gpus=4, cpu=64, sharing=TS, mig={0: [G3, G4], 1: [G1, G1, G4]})


@dataclass
class LimitCase:
    name: str
    queue: QueueInfo
    jobs: list[JobInfo]
    started: set[int]
    limited: dict[int, str] = field(default_factory=dict)  # job -> its code


def _held(id: int, profile: str, device: int, k: int, **kw: object) -> JobInfo:
    return job(id, mig=profile, cpu=0.5, running_on=[("a", (device,))],
               instances=[mig_uuid("a", device, k)], **kw)  # type: ignore[arg-type]  # fmt: skip


LIMIT_CASES = [
    LimitCase(
        "a MIG instance counts as its slices under a per-user GPU limit",
        QueueInfo("default", max_user_gpus=1),
        [_held(1, G4, 0, 1), job(2, mig=G4, cpu=0.5)],
        set(),
        {2: Code.USER_LIMIT},
    ),
    LimitCase(
        "instances within the limit start",
        QueueInfo("default", max_user_gpus=1),
        [_held(1, G3, 0, 0), job(2, mig=G1, cpu=0.5), job(3, mig=G1, cpu=0.5)],
        {2, 3},
    ),
    LimitCase(
        "a fraction counts as its share under a per-user GPU limit",
        QueueInfo("default", max_user_gpus=1),
        [job(1, share=750, cpu=0.5, running_on=[("a", (2,))]), job(2, share=500, cpu=0.5)],
        set(),
        {2: Code.USER_LIMIT},
    ),
    LimitCase(
        "fractions within the limit start",
        QueueInfo("default", max_user_gpus=1),
        [job(1, share=500, cpu=0.5, running_on=[("a", (2,))]),
         job(2, share=250, cpu=0.5), job(3, share=250, cpu=0.5)],
        {2, 3},
    ),
    LimitCase(
        "a queue capability counts running fractions as their shares",
        QueueInfo("default", capability=Resources(64_000, 1 << 40, 1)),
        [job(1, share=750, cpu=0.5, running_on=[("a", (2,))]), job(3, share=500, cpu=0.5)],
        set(),
        {3: Code.QUEUE_QUOTA},
    ),
    LimitCase(
        "a queue capability counts MIG instances as their slices",
        QueueInfo("default", capability=Resources(64_000, 1 << 40, 1)),
        [_held(1, G4, 0, 1), job(2, mig=G4, cpu=0.5)],
        set(),
        {2: Code.QUEUE_QUOTA},
    ),
    LimitCase(
        "a fraction within the queue capability starts",
        QueueInfo("default", capability=Resources(64_000, 1 << 40, 1)),
        [job(1, share=500, cpu=0.5, running_on=[("a", (2,))]), job(2, share=500, cpu=0.5)],
        {2},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", LIMIT_CASES, ids=lambda c: c.name)
def test_gpu_limits(case: LimitCase) -> None:
    snap = snapshot([_mig_node()], case.jobs, [case.queue])
    result = run_cycle(snap, ALLOCATE)
    assert {b.job_id for b in result.binds} == case.started
    assert {j: result.pending[j].code for j in case.limited} == case.limited


def test_the_limit_message_says_gpus_as_fractions() -> None:
    snap = snapshot(
        [_mig_node()], [_held(1, G4, 0, 1), job(2, mig=G4, cpu=0.5)],
        [QueueInfo("default", max_user_gpus=1)],
    )  # fmt: skip
    message = run_cycle(snap, ALLOCATE).pending[2].message
    assert "running GPUs 0.571/1 in use by the owner, this job needs 0.571 more" in message


def test_an_owner_at_the_gpu_limit_waits_in_the_start_estimate_for_a_share_to_end() -> None:
    """Under max_user_gpus=1, with 0.5 until 900 and 0.25 until 1900 running, a half waits
    only for the first (counted as whole devices, it waited for both)."""
    nodes = [node("a", gpus=3, sharing=TS)]
    jobs = [
        job(1, share=500, walltime=1000, running_on=[("a", (0,))]),
        job(2, share=250, walltime=2000, running_on=[("a", (1,))]),
        job(3, share=500),
    ]
    snap = snapshot(nodes, jobs, [QueueInfo("default", max_user_gpus=1)])
    plan = plan_starts(snap, run_cycle(snap, ALLOCATE), ALLOCATE)
    assert plan.starts[3] == NOW + 900


@pytest.mark.parametrize(
    ("gang", "refused"),
    [
        (job(1, share=250, replicas=4, cpu=0.5), False),
        (job(1, share=500, replicas=3, cpu=0.5), True),
        (job(1, mig=G4, replicas=2, cpu=0.5), True),
        (job(1, mig=G1, replicas=2, cpu=0.5), False),
        (job(1, gpu=1, replicas=2, cpu=0.5), True),
    ],
    ids=["4 quarters", "3 halves", "2 4g", "2 1g", "2 whole"],
)
def test_submit_and_the_core_count_a_gang_against_the_capability_alike(
    gang: JobInfo, refused: bool
) -> None:
    """A queue of one GPU: a gang is refused at submit (`fit.over_capability`) exactly when
    the core says it never fits the queue, both counting GPUs in thousandths."""
    first = gang.tasks[0]
    ask = Ask("tasks.0", first.group, first.resources, len(gang.tasks), {},
              first.gpu_share, gpu_mig=first.gpu_mig)  # fmt: skip
    problems = over_capability([ask], gang.min_available, {"gpu": 1}, "default")
    assert bool(problems) == refused
    queue = QueueInfo("default", capability=Resources(64_000, 1 << 40, 1))
    status = run_cycle(snapshot([_mig_node()], [gang], [queue]), ALLOCATE).pending.get(1)
    core_refused = status is not None and "may ever hold" in status.message
    assert core_refused == refused


# --- start estimates for MIG instances -------------------------------------------------------


def _mig_jobs() -> list[JobInfo]:
    """GPU 0's three 1g instances held: until 900, until 1900 and for ever (no walltime);
    GPU 1's 2g instance free (another profile), cpu to spare."""
    return [
        _held(1, G1, 0, 0, walltime=1000),
        _held(2, G1, 0, 1, walltime=2000),
        _held(9, G1, 0, 2, walltime=None),
    ]


@pytest.mark.parametrize(
    ("waiting", "starts"),
    [
        ([job(3, mig=G1, cpu=0.5, walltime=100)], {3: 900}),
        ([job(3, mig=G1, cpu=0.5, replicas=2, walltime=100)], {3: 1900}),
        (
            [
                job(3, mig=G1, cpu=0.5, walltime=2000),
                job(4, mig=G1, cpu=0.5, walltime=100, created_at=3.5),
            ],
            {3: 900, 4: 1900},
        ),
        ([job(3, mig=G1, cpu=0.5, replicas=3, walltime=100)], {3: None}),
    ],  # fmt: skip
    ids=[
        "one waits for the first instance back",
        "a gang for two",
        "the second after the first's run",
        "a gang for three, one held for ever",
    ],  # fmt: skip
)
def test_a_mig_request_is_planned_when_an_instance_of_its_profile_is_free(
    waiting: list[JobInfo], starts: dict[int, float | None]
) -> None:
    nodes = [node("a", gpus=2, cpu=64, sharing=TS, mig={0: [G1, G1, G1], 1: ["2g.20gb"]})]
    snap = snapshot(nodes, [*_mig_jobs(), *waiting])
    config = SchedulingPolicy(actions=("enqueue", "allocate"), strict_order=False)
    plan = plan_starts(snap, run_cycle(snap, config), config)
    got = {j: None if (t := plan.starts[j]) is None else t - NOW for j in starts}
    assert got == starts


@pytest.mark.parametrize(
    "first",
    [
        _releasing(job(1, share=500, walltime=5000, running_on=[("a", (0,))])),
        job(1, share=500, walltime=5000, running_on=[("a", (0,))], suspend_requested=True),
    ],
    ids=["releasing", "being suspended"],
)
def test_the_reservation_gets_a_shared_device_back_when_its_last_occupant_leaves(
    first: JobInfo,
) -> None:
    """One occupant leaving now, the other at 900: the whole-GPU job first in line is
    reserved for 900 (not never, not the first's walltime)."""
    nodes = [node("a", gpus=1, sharing=TS)]
    jobs = [first, job(2, share=500, walltime=1000, running_on=[("a", (0,))]),
            job(3, gpu=1, walltime=100)]  # fmt: skip
    result = run_cycle(snapshot(nodes, jobs), EASY)
    assert result.pending[3].code == Code.RESERVED
    assert result.pending[3].estimated_start == NOW + 900
