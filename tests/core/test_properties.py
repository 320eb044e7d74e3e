"""Properties over random clusters, queues and jobs."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.cycle import CycleResult, run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy, Snapshot
from scheduler.core.priority import PriorityWeights
from tests.core.builders import NOW, job, node

QUEUES = [QueueInfo("default", weight=1), QueueInfo("research", weight=2)]
# The same queues with per-user running limits (one of them exempts owner "a").
LIMITED_QUEUES = [
    QueueInfo("default", weight=1, max_user_gpus=2, max_user_jobs=2),
    QueueInfo("research", weight=2, max_user_cpus=4000, limits_exempt=frozenset({"a"})),
]
OWNERS = ["a", "b", "c"]


def random_node(
    draw: st.DrawFn, i: int, states: list[str], sharing: bool = False, always_shared: bool = False
) -> NodeInfo:
    """Node n<i> of a drawn cluster: GPUs, CPUs, memory, a zone label and a state drawn from
    `states`; with `sharing`, also whether it offers time-sliced GPU sharing (with
    `always_shared`, it does)."""
    offers = [("timeslice",)] if always_shared else [(), ("timeslice",), ("timeslice",)]
    return node(
        f"n{i}",
        gpus=draw(st.integers(0, 4)),
        cpu=draw(st.integers(1, 8)),
        memory_gi=draw(st.integers(1, 16)),
        labels=draw(st.sampled_from([{}, {"zone": "a"}, {"zone": "b"}])),
        state=draw(st.sampled_from(states)),
        sharing=draw(st.sampled_from(offers)) if sharing else (),
    )


@st.composite
def clusters(draw: st.DrawFn, fraction_gangs: bool = False, mig: bool = False) -> Snapshot:
    """`fraction_gangs`: every node shares its GPUs and most jobs are gangs of fractions.
    `mig`: every GPU is cut into MIG instances and most jobs are gangs of instances."""
    states = ["Ready", "Ready", "Ready", "Cordoned", "NotReady"]
    count = draw(st.integers(1, 6))
    if mig:
        nodes = [mig_node(draw, i, states) for i in range(count)]
    else:
        nodes = [
            random_node(draw, i, states, True, always_shared=fraction_gangs) for i in range(count)
        ]
    random_job = mig_gang if mig else fraction_gang if fraction_gangs else any_job
    jobs = [random_job(draw, i) for i in range(1, draw(st.integers(1, 14)))]
    # (Not per-user limits with MIG: there a backfilled job of the holder's owner can use up
    # the owner's limit and hold up the reservation, for any job, MIG or not: not the
    # instances these clusters are about.)
    queues = draw(st.sampled_from([QUEUES] if mig else [QUEUES, QUEUES, LIMITED_QUEUES]))
    first = Snapshot(NOW - 500, nodes, queues, jobs)
    # Run what fits for a while, then add a new wave of jobs: running work to preempt,
    # reserve around and backfill next to.
    running = _apply(first, run_cycle(first), started=NOW - 500)
    wave = [random_job(draw, i) for i in range(100, 100 + draw(st.integers(1, 14)))]
    usage = {o: draw(st.sampled_from([0.0, 10.0, 1e6])) for o in OWNERS}
    shares = draw(st.sampled_from([{}, {"a": 3.0}, {"b": 0.0}]))
    return Snapshot(NOW, nodes, queues, running + wave, usage, shares)


MIG_PROFILES = ["1g.10gb", "1g.10gb", "2g.20gb"]


def mig_node(draw: st.DrawFn, i: int, states: list[str]) -> NodeInfo:
    """Node n<i> whose one or two GPUs are each cut into one to three MIG instances."""
    gpus = draw(st.integers(1, 2))
    layout = st.lists(st.sampled_from(MIG_PROFILES), min_size=1, max_size=3)
    return node(
        f"n{i}",
        gpus=gpus,
        cpu=draw(st.integers(1, 8)),
        memory_gi=draw(st.integers(1, 16)),
        state=draw(st.sampled_from(states)),
        mig={d: draw(layout) for d in range(gpus)},
    )


def mig_gang(draw: st.DrawFn, id: int) -> JobInfo:
    """A gang of MIG instances of one profile (now and then a job asking no GPU)."""
    replicas = draw(st.integers(1, 3))
    return job(
        id,
        mig=draw(st.sampled_from(["", *MIG_PROFILES])),
        cpu=draw(st.sampled_from([0.5, 1, 2])),
        memory_gi=draw(st.integers(1, 4)),
        replicas=replicas,
        min_available=draw(st.integers(1, replicas)),
        priority=draw(st.integers(0, 3)),
        queue=draw(st.sampled_from(["default", "research"])),
        walltime=draw(st.sampled_from([None, 50.0, 300.0, 2000.0])),
        preemptible=draw(st.booleans()),
        created_at=float(id),
        owner=draw(st.sampled_from(OWNERS)),
    )


def fraction_gang(draw: st.DrawFn, id: int) -> JobInfo:
    """A gang of fractions of GPUs (now and then a whole-GPU job beside them)."""
    share = draw(st.sampled_from([100, 250, 500, 700, 0]))
    return any_job(draw, id, replicas=draw(st.integers(1, 6)), share=share)


def any_job(
    draw: st.DrawFn, id: int, replicas: int | None = None, share: int | None = None
) -> JobInfo:
    replicas = draw(st.integers(1, 3)) if replicas is None else replicas
    return job(
        id,
        gpu=draw(st.integers(0, 3)),
        cpu=draw(st.sampled_from([0.5, 1, 2, 4])),
        memory_gi=draw(st.integers(1, 8)),
        replicas=replicas,
        min_available=draw(st.integers(1, replicas)),
        priority=draw(st.integers(0, 3)),
        queue=draw(st.sampled_from(["default", "research"])),
        selector=draw(st.sampled_from([{}, {}, {"zone": "a"}, {"zone": "c"}])),
        walltime=draw(st.sampled_from([None, 50.0, 300.0, 2000.0])),
        preemptible=draw(st.booleans()),
        created_at=float(id),
        owner=draw(st.sampled_from(OWNERS)),
        # A fraction of one GPU for some jobs (then `gpu` is 1: the device it goes on).
        share=draw(st.sampled_from([0, 0, 0, 250, 500, 700])) if share is None else share,
    )


def _apply(snapshot: Snapshot, result: CycleResult, started: float) -> list[JobInfo]:
    """The snapshot's jobs with the result's binds as running tasks (placed jobs only)."""
    by_task = {b.task_id: b for b in result.binds}
    out = []
    for j in snapshot.jobs:
        tasks = []
        for t in j.tasks:
            bind = by_task.get(t.id)
            if bind is not None:
                t = dataclasses.replace(
                    t,
                    state="Running",
                    node=bind.node,
                    devices=bind.devices,
                    gpu_instance=bind.instance,
                    started_at=started,
                )
            tasks.append(t)
        placed = any(t.node for t in tasks)
        out.append(dataclasses.replace(j, tasks=tasks, state="Running" if placed else j.state))
    return out


WEIGHTS = st.one_of(
    st.just(PriorityWeights()),
    st.builds(
        PriorityWeights,
        age=st.sampled_from([0.0, 1.0, 1000.0]),
        fair_share=st.sampled_from([0.0, 1.0, 10_000.0]),
        job_size=st.sampled_from([0.0, 500.0]),
        queue=st.sampled_from([0.0, 10.0]),
        priority=st.sampled_from([0.0, 1.0, 100.0]),
        max_age=st.sampled_from([60.0, 7 * 86400.0]),
        favor_small=st.booleans(),
    ),
)
BASES = st.sampled_from([SchedulingPolicy(), SchedulingPolicy.easy(), SchedulingPolicy.fcfs()])
# Every factor setting: no weight may break an invariant below.
CONFIGS = st.builds(
    lambda base, weights: dataclasses.replace(base, priority_weights=weights), BASES, WEIGHTS
)
EASY = st.builds(
    lambda weights: dataclasses.replace(SchedulingPolicy.easy(), priority_weights=weights), WEIGHTS
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(clusters(), CONFIGS)
def test_it_never_over_allocates_a_node_or_device(snap: Snapshot, config: SchedulingPolicy) -> None:
    _never_over_allocates(snap, config)


def _never_over_allocates(snap: Snapshot, config: SchedulingPolicy) -> None:
    result = run_cycle(snap, config)
    cpu: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    # (node, device) -> the thousandths of it each holder holds (1000: a whole GPU)
    held: dict[tuple[str, int], list[int]] = defaultdict(list)
    tasks = {t.id: t for j in snap.jobs for t in j.tasks}
    placed = [(t.node, t.devices, t) for t in tasks.values() if t.node]
    placed += [(b.node, b.devices, tasks[b.task_id]) for b in result.binds]
    for b in result.binds:
        assert len(b.devices) == tasks[b.task_id].resources.gpu
        assert snap_node(snap, b.node).sharing or not tasks[b.task_id].gpu_share
    for name, devices, t in placed:
        cpu[name] += t.resources.cpu
        memory[name] += t.resources.memory
        for d in devices:
            held[(name, d)].append(t.gpu_share or 1000)
    for n in snap.nodes:
        assert cpu[n.name] <= n.allocatable.cpu
        assert memory[n.name] <= n.allocatable.memory
    for (name, d), shares in held.items():
        assert d in {dev.index for dev in snap_node(snap, name).devices}
        # Never past one GPU; a whole GPU is alone on its device.
        assert sum(shares) <= 1000
    assert all(snap_node(snap, b.node).state == "Ready" for b in result.binds)


def snap_node(snap: Snapshot, name: str) -> NodeInfo:
    return next(n for n in snap.nodes if n.name == name)


@FAST
@given(clusters(), CONFIGS)
def test_it_starts_gangs_whole_and_says_why_every_job_waits(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    _starts_gangs_whole(snap, config)


def _starts_gangs_whole(snap: Snapshot, config: SchedulingPolicy) -> None:
    result = run_cycle(snap, config)
    bound: dict[int, int] = defaultdict(int)
    for b in result.binds:
        bound[b.job_id] += 1
    for j in snap.jobs:
        if j.state == "Running":
            # A running job may only grow into its own pending tasks.
            pending = sum(1 for t in j.tasks if t.state == "Pending")
            assert bound[j.id] <= pending
            continue
        if j.id in bound:
            assert bound[j.id] >= j.min_available
            assert j.id not in result.pending
        else:
            info = result.pending[j.id]
            assert info.code and info.message
            assert info.code not in ("SchedulerError", "NothingToPlace")


@FAST
@given(clusters(), WEIGHTS)
def test_it_only_evicts_what_it_may(snap: Snapshot, weights: PriorityWeights) -> None:
    result = run_cycle(snap, SchedulingPolicy(priority_weights=weights))
    jobs = {j.id: j for j in snap.jobs}
    for n, e in enumerate(result.evictions):
        victim, preemptor = jobs[e.job_id], jobs[e.preemptor_job_id]
        assert victim.state == "Running" and victim.preemptible
        if e.reason == "Preempted":
            assert victim.queue == preemptor.queue
            assert victim.priority < preemptor.priority
        else:
            assert e.reason == "Reclaimed" and victim.queue != preemptor.queue
            # Shares as the cycle saw them: placed before reclaim, minus earlier evictions.
            seen = _decided(snap, result, n)
            assert queue_share(seen, victim.queue) > queue_share(seen, preemptor.queue)
    # Whole jobs: a victim is never evicted twice, nor a job that is already stopping.
    assert len({e.job_id for e in result.evictions}) == len(result.evictions)
    for e in result.evictions:
        victim = jobs[e.job_id]
        assert not victim.suspend_requested
        assert all(t.state != "Releasing" for t in victim.tasks)


def _decided(snap: Snapshot, result: CycleResult, n: int) -> Snapshot:
    """The snapshot with the binds made before backfill and without the first n victims."""
    allocated = CycleResult(binds=[b for b in result.binds if b.action != "backfill"])
    gone = {e.job_id for e in result.evictions[:n]}
    jobs = [j for j in _apply(snap, allocated, started=snap.now) if j.id not in gone]
    return Snapshot(snap.now, snap.nodes, snap.queues, jobs, snap.usage, snap.shares)


def queue_share(snap: Snapshot, queue: str) -> float:
    """Weighted dominant share of what the queue's tasks hold in the snapshot."""
    weights = {q.name: q.weight for q in snap.queues}
    held: dict[str, float] = {"cpu": 0, "memory": 0, "gpu": 0}
    total = {"cpu": 0, "memory": 0, "gpu": 0}
    for n in snap.nodes:
        total["cpu"] += n.allocatable.cpu
        total["memory"] += n.allocatable.memory
        total["gpu"] += sum(1 for d in n.devices if d.healthy)
    for j in snap.jobs:
        for t in j.tasks:
            if j.queue == queue and t.node:
                held["cpu"] += t.resources.cpu
                held["memory"] += t.resources.memory
                held["gpu"] += t.gpu_share / 1000 if t.gpu_share else len(t.devices)
    share = max((held[d] / total[d] for d in held if total[d]), default=0.0)
    return share / weights[queue]


@FAST
@given(clusters(), CONFIGS)
def test_it_decides_the_same_for_the_same_snapshot(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    before = copy.deepcopy(snap)
    first, second = run_cycle(snap, config), run_cycle(snap, config)
    assert snap == before  # the cycle works on its own view; the snapshot is untouched
    assert (first.binds, first.evictions, first.pending) == (
        second.binds,
        second.evictions,
        second.pending,
    )


@FAST
@given(clusters(), EASY)
def test_it_never_lets_a_backfilled_job_delay_the_reservation(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    _never_delays_the_reservation(snap, config)


def _never_delays_the_reservation(snap: Snapshot, config: SchedulingPolicy) -> None:
    result = run_cycle(snap, config)
    reserved = [i for i, p in result.pending.items() if p.code == "Reserved"]
    backfilled = {b.job_id for b in result.binds if b.action == "backfill"}
    if not reserved or not backfilled:
        return
    (holder,) = reserved
    promised = result.pending[holder].estimated_start
    # Start the jobs placed this cycle, leave only the reserved job waiting, and plan again.
    after = _apply(snap, result, started=snap.now)
    # Running jobs keep only their placed tasks: none of them competes with the holder again.
    jobs = [
        dataclasses.replace(j, tasks=[t for t in j.tasks if t.node]) if j.state == "Running" else j
        for j in after
        if j.state == "Running" or j.id == holder
    ]
    again = run_cycle(dataclasses.replace(snap, jobs=jobs), config)
    if holder in {b.job_id for b in again.binds}:
        return  # it starts now: not delayed
    replanned = again.pending[holder].estimated_start
    if promised is None:
        return
    assert replanned is not None and replanned <= promised


# --- the same invariants where most jobs are gangs of fractions of GPUs ---------------------
# (gangs and EASY's reservation count a fraction as its share of a device)


@FAST
@given(clusters(fraction_gangs=True), CONFIGS)
def test_fraction_gangs_never_over_allocate(snap: Snapshot, config: SchedulingPolicy) -> None:
    _never_over_allocates(snap, config)


@FAST
@given(clusters(fraction_gangs=True), CONFIGS)
def test_fraction_gangs_start_whole(snap: Snapshot, config: SchedulingPolicy) -> None:
    _starts_gangs_whole(snap, config)


@FAST
@given(clusters(fraction_gangs=True), EASY)
def test_fraction_gangs_never_delay_the_reservation(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    _never_delays_the_reservation(snap, config)


# --- the reservation where GPUs are cut into MIG instances ---------------------------------
# (EASY's reservation of a MIG gang waits for instances of its profile; backfill keeps them)


@FAST
@given(clusters(mig=True), EASY)
def test_mig_gangs_never_delay_the_reservation(snap: Snapshot, config: SchedulingPolicy) -> None:
    _never_delays_the_reservation(snap, config)


@FAST
@given(clusters(mig=True), EASY)
def test_a_mig_gang_starts_when_its_reservation_says(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    """Once every running job (those backfilled included) has reached its walltime by the
    reservation's start, the reserved gang starts then: its instances are free."""
    result = run_cycle(snap, config)
    reserved = [i for i, p in result.pending.items() if p.code == "Reserved"]
    if not reserved or result.pending[reserved[0]].estimated_start is None:
        return
    (holder,) = reserved
    start = result.pending[holder].estimated_start
    assert start is not None
    after = _apply(snap, result, started=snap.now)
    jobs = [
        dataclasses.replace(j, tasks=[t for t in j.tasks if t.node]) if j.state == "Running" else j
        for j in after
        if j.id == holder or (j.state == "Running" and not _ended(j, start))
    ]
    later = run_cycle(dataclasses.replace(snap, now=start, jobs=jobs), config)
    assert holder in {b.job_id for b in later.binds}, later.pending.get(holder)


def _ended(j: JobInfo, at: float) -> bool:
    """Has the running job reached its walltime by `at`?"""
    starts = [t.started_at for t in j.tasks if t.node and t.started_at is not None]
    return j.walltime is not None and bool(starts) and max(starts) + j.walltime <= at


@FAST
@given(clusters(mig=True), CONFIGS)
def test_mig_gangs_start_whole(snap: Snapshot, config: SchedulingPolicy) -> None:
    _starts_gangs_whole(snap, config)
