"""The steady cycle's shortcuts (bench/cycle.py --steady) decide as the straightforward code
they replaced: opening a session (`_sort_out`, `_load_running`, `_open_totals`: one pass
over the running tasks, each queue's sum at once, shared devices looked for only on nodes
holding fractions), the victims' order (`_victim_key`), DRF's reclaimable queues asked once
per queue, and `_evict_one` letting go of the victims it does not need by marks rather than
`list.remove`, with the fractions on nodes looked for once per action. Each is compared
with the code it replaced (kept here) on random clusters."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from scheduler.core import actions, model, plugins, predict, sharing
from scheduler.core import session as session_module
from scheduler.core.actions import _free_into, _GangRoom, _pipeline, _victim_key, simulate
from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.plugins import DRFPlugin, default_plugins, fair_share
from scheduler.core.resources import Resources
from scheduler.core.session import (
    Session,
    grows,
    held_resources,
    whole_devices,
)
from scheduler.core.statement import Statement
from scheduler.core.types import HOLDS_RESOURCES, NodeView
from tests.core.builders import GI, NOW, job, node, snapshot

QUEUES = ["a", "b", "c"]


def random_snapshot(rng: random.Random) -> Snapshot:
    """Nodes with whole GPUs, shared ones and MIG instances (some not Ready); running jobs
    (some being released, suspended, on a node that is gone, or with tasks left to place),
    pending gangs of one or two shapes, over queues of different weights (one unknown)."""
    nodes = []
    free: dict[str, list[int]] = {}
    for i in range(rng.randint(1, 6)):
        gpus = rng.choice([0, 2, 4])
        kind = rng.random()
        if gpus and kind < 0.2:
            nodes.append(node(f"n{i}", gpus=gpus, cpu=16, mig={0: ["1g.10gb", "1g.10gb"]}))
        else:
            sharing_modes = ("timeslice",) if gpus and kind < 0.5 else ()
            nodes.append(node(f"n{i}", gpus=gpus, cpu=16, sharing=sharing_modes))
        if rng.random() < 0.1:
            nodes[-1].state = "NotReady"
        free[f"n{i}"] = list(range(gpus))
    jobs: list[JobInfo] = []
    for i in range(1, rng.randint(4, 24)):
        queue = rng.choice(QUEUES + ["gone"] if rng.random() < 0.05 else QUEUES)
        priority = rng.choice([0, 1, 5, 10])
        walltime = rng.choice([None, 600.0, 3600.0])
        roll = rng.random()
        if roll < 0.55:  # running
            name = rng.choice(list(free) + ["elsewhere"] if rng.random() < 0.05 else list(free))
            devices = free.get(name, [])
            if roll < 0.15 and devices:
                made = job(
                    i, share=rng.choice([250, 500]), running_on=[(name, (devices[0],))],
                    queue=queue, priority=priority, walltime=walltime,
                    started_at=NOW - rng.choice([10, 100, 5000]),
                )  # fmt: skip
            elif roll < 0.2 and name in free and any(n.name == name and n.sharing for n in nodes):
                made = job(
                    i, mig="1g.10gb", running_on=[(name, (0,))], queue=queue, priority=priority,
                    instances=[f"MIG-{name}-0-0"],
                )  # fmt: skip
            else:
                gpu = min(len(devices), rng.choice([0, 1, 2]))
                taken = tuple(devices[:gpu])
                del devices[:gpu]
                made = job(
                    i, gpu=gpu, cpu=rng.choice([1, 4]), running_on=[(name, taken)], queue=queue,
                    priority=priority, walltime=walltime, preemptible=rng.random() < 0.8,
                    started_at=NOW - rng.choice([10, 100, 5000]),
                    predicted=rng.choice([None, None, 50.0]),
                )  # fmt: skip
            if rng.random() < 0.1:
                made.tasks = [replace(t, state="Releasing") for t in made.tasks]
            if rng.random() < 0.05:
                made.suspend_requested = True
            if rng.random() < 0.1:  # a gang started with min_available, one task to go
                extra = replace(made.tasks[0], id=10_000 + i, state="Pending", node=None,
                                devices=(), started_at=None)  # fmt: skip
                made.tasks.append(extra)
                made.min_available = 1
            jobs.append(made)
            continue
        replicas = rng.choice([1, 1, 2, 3])
        made = job(
            i, gpu=rng.choice([0, 1, 2, 4]), cpu=rng.choice([1, 2, 8]), replicas=replicas,
            queue=queue, priority=priority, walltime=walltime,
            state=rng.choice(["Pending", "Pending", "Pending", "Suspended"]),
        )  # fmt: skip
        if replicas > 1 and rng.random() < 0.3:  # two runs: not one `_GangRoom`
            first = made.tasks[0]
            made.tasks[0] = replace(first, resources=first.resources + Resources(1000, GI, 0))
        jobs.append(made)
    queues = [
        QueueInfo("a", weight=1.0),
        QueueInfo("b", weight=3.0, reclaimable=rng.random() < 0.8),
        QueueInfo("c", weight=0.5),
    ]
    return snapshot(nodes, jobs, queues)


# --- the code the shortcuts replaced -------------------------------------------------------


def old_sort_out(jobs: list[JobInfo]) -> Any:
    candidates, need, running, pending, holders = [], {}, [], {}, []
    for j in jobs:
        if j.state == "Running":
            running.append(j)
        if not (j.is_candidate or grows(j)):
            holders.append(j)
            continue
        candidates.append(j)
        held = sum(1 for t in j.tasks if t.node and t.state in ("Assigned", "Running"))
        need[j.id] = max(0, j.min_available - held)
        pending[j.id] = [t for t in j.tasks if t.state == "Pending"]
        if any(t.state in HOLDS_RESOURCES for t in j.tasks):
            holders.append(j)
    return candidates, need, running, pending, holders


def old_hold_devices(node: NodeView, task: TaskInfo) -> None:
    for d in task.devices:
        if task.gpu_mig:
            sharing.take(node, task, d, task.gpu_instance)
        elif task.gpu_share:
            if d in node.shared or d in node.free_devices:
                sharing.take(node, task, d)
        elif d in node.free_devices:
            node.free_devices.remove(d)


class OldSession(Session):
    """A session opened the way it was before the shortcuts."""

    def _load_running(self, jobs: Any) -> Any:
        for j in jobs:
            held: Resources | None = None
            shared = 0
            for task in j.tasks:
                if task.state not in HOLDS_RESOURCES or task.node is None:
                    continue
                node_view = self.node_by_name.get(task.node)
                if node_view is None:
                    continue
                node_view.free_cpu -= task.resources.cpu
                node_view.free_memory -= task.resources.memory
                old_hold_devices(node_view, task)
                if task.state == "Releasing" or j.suspend_requested:
                    node_view.rel_cpu += task.resources.cpu
                    node_view.rel_memory += task.resources.memory
                    node_view.rel_devices += whole_devices(task)
                node_view.tasks.append((j, task))
                held = held_resources(task) if held is None else held + held_resources(task)
                shared += task.gpu_share
            if held is None:
                continue
            queue = self.queues.get(j.queue)
            if queue is not None and not held.is_zero():
                queue.allocated = queue.allocated + held
            if queue is not None:
                queue.shared_gpu += shared
        return [], [], set(), 0

    def _open_totals(self, *_: Any) -> None:
        self.ready_free = {n.name: n.free() for n in self.nodes if n.ready}
        self.ready_free_cpu = sum(f.cpu for f in self.ready_free.values())
        self.ready_free_memory = sum(f.memory for f in self.ready_free.values())
        self.ready_free_gpu = sum(f.gpu for f in self.ready_free.values())
        self._stale_free = set()
        self.walltime_ends = []
        self.releasing = 0
        self.releasers = sharing.releasers(self.nodes, self.leaves_at)
        self.fraction_nodes = self.nodes  # (before: every node was looked through)
        self.pinned = set()
        on_nodes: list[tuple[JobInfo, TaskInfo, str]] = []
        for n in self.nodes:
            self.releasing += sum(task.state == "Releasing" for _job, task in n.tasks)
            on_nodes.extend((j, task, n.name) for j, task in n.tasks)
        self.add_ends(on_nodes)

    def add_ends(self, started: list[tuple[JobInfo, TaskInfo, str]]) -> None:
        """Each task's planned end, appended and sorted in one `list.sort`."""
        correction = self.config.prediction_correction
        for j, task, name in started:
            if j.walltime is None or task.started_at is None or task.state == "Releasing":
                continue
            if j.predicted is None:
                at = task.started_at + j.walltime
            else:
                at = predict.end(j, task.started_at, self.now, correction) or 0.0
            request = task.resources
            release = (
                request
                if request.gpu == len(task.devices) and not task.gpu_share
                else Resources(request.cpu, request.memory, self.device_release(task))
            )
            self.walltime_ends.append((at, name, task.id, j.id, release))
        self.walltime_ends.sort()


class OldNodeView(NodeView):
    """A node's view made the way it was before the one pass over its devices."""

    def __init__(self, info: model.NodeInfo) -> None:
        self.name = info.name
        self.labels = info.labels
        self.state = info.state
        self.allocatable = info.allocatable
        healthy = sorted(d.index for d in info.devices if d.healthy and not d.mig)
        self.healthy_devices = len(healthy)
        self.free_cpu = info.allocatable.cpu
        self.free_memory = info.allocatable.memory
        self.free_devices = healthy
        self.rel_cpu = 0
        self.rel_memory = 0
        self.rel_devices = 0
        self.label_key = tuple(sorted(self.labels.items()))
        self.tasks = []
        self.sharing = info.sharing
        self.shared = {}
        self.shared_memory = {}
        self.device_memory = {d.index: d.memory for d in info.devices if not d.mig}
        self.model = next((d.model for d in info.devices if d.model), "")
        self.mig_free = {}
        for device in info.devices:
            for instance in device.mig if device.healthy else ():
                self.mig_free.setdefault(instance.profile, []).append((device.index, instance.uuid))
        self.mig_profiles = frozenset(self.mig_free)
        self.mig_total = {p: len(free) for p, free in self.mig_free.items()}
        self.mig_held = {}


def old_victim_key(v: JobInfo) -> tuple[Any, ...]:
    held, gpu = Resources(), 0
    for task in v.tasks:
        if task.state in ("Assigned", "Running"):
            held = held + task.resources
            gpu += sharing.gpu_milli(task)
    start = max((t.started_at or 0.0 for t in v.tasks), default=0.0)
    return (v.priority, (gpu, held.cpu, held.memory), -start)


def old_reclaimable(
    self: DRFPlugin, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
) -> list[JobInfo]:
    mine = session.queues.get(reclaimer.queue)
    if mine is None or session.queue_share(mine) >= self.deserved(session, reclaimer.queue):
        return []
    keep = []
    for victim in victims:
        queue = session.queues.get(victim.queue)
        if queue is None or not queue.info.reclaimable:
            continue
        if session.queue_share(queue) > self.deserved(session, victim.queue):
            keep.append(victim)
    return keep


class OldSharedDevices(actions._SharedDevices):
    def __init__(self, session: Session) -> None:
        self.holding: Counter[tuple[str, int]] = Counter()
        occupied: set[tuple[str, int]] = set()
        for n in session.nodes:
            for j, task in n.tasks:
                if not task.gpu_share or task.gpu_mig:
                    continue
                gone = task.state == "Releasing" or j.suspend_requested
                for device in task.devices:
                    occupied.add((n.name, device))
                    if not gone and j.id not in session.evicted:
                        self.holding[(n.name, device)] += 1
        self.released = Counter(n for n, d in occupied if not self.holding[(n, d)])


def old_future_room(session: Session) -> tuple[dict[str, Resources], OldSharedDevices]:
    room = {}
    shared = OldSharedDevices(session)
    for n in session.nodes:
        if n.ready and n.name not in session.nominated:
            room[n.name] = n.free() + n.releasing() + Resources(0, 0, shared.released[n.name])
    return room, shared


def old_evict_one(session: Session, job: JobInfo, reason: str, select: Any, *_: Any) -> None:
    if any(task.gpu_mig for task in session.pending_tasks(job)):
        return
    room, shared = old_future_room(session)
    placement = simulate(session, job, room)
    if placement is not None:
        _pipeline(session, job, placement, [])
        return
    victims = select(job, [j for j in session.running if j.id not in session.evicted])
    if not victims:
        return
    victims.sort(key=old_victim_key)
    fits = _GangRoom.of(session, job, room)
    chosen: list[JobInfo] = []
    for victim in victims:
        chosen.append(victim)
        _free_into(room, victim, +1, fits, shared)
        placement = simulate(session, job, room) if fits is None or fits.enough() else None
        if placement is not None:
            break
    if placement is None:
        return
    for victim in list(reversed(chosen[:-1])):
        _free_into(room, victim, -1, fits, shared)
        if fits is not None:
            if fits.enough():
                chosen.remove(victim)
            else:
                _free_into(room, victim, +1, fits, shared)
            continue
        trial = simulate(session, job, room)
        if trial is None:
            _free_into(room, victim, +1, None, shared)
        else:
            chosen.remove(victim)
            placement = trial
    if fits is not None:
        placement = simulate(session, job, room)
        assert placement is not None
    statement = Statement(session)
    for victim in chosen:
        statement.evict(victim, reason, job)
    statement.commit(reason)
    _pipeline(session, job, placement, chosen)


# --- the comparisons ---------------------------------------------------------------------


def opened(s: Session) -> Any:
    """Everything opening the session worked out."""
    return (
        [j.id for j in s.candidates], s.need, [j.id for j in s.running],
        {i: [t.id for t in ts] for i, ts in s._pending_tasks.items()}, s.floor,
        [
            (n.name, n.free_cpu, n.free_memory, n.free_devices, n.rel_cpu, n.rel_memory,
             n.rel_devices, [(j.id, t.id) for j, t in n.tasks], n.shared, n.mig_free)
            for n in s.nodes
        ],
        {name: (q.allocated, q.shared_gpu) for name, q in s.queues.items()},
        s.ready_free, s.ready_free_cpu, s.ready_free_memory, s.ready_free_gpu,
        s.walltime_ends, s.releasing, s.releasers, s.total, s.max_devices, s.all_ready,
        [
            (n.healthy_devices, n.label_key, n.device_memory, n.model, n.mig_profiles,
             n.mig_total, n.mig_held, n.shared_memory, n.sharing)
            for n in s.nodes
        ],
    )  # fmt: skip


POLICY = SchedulingPolicy()


@pytest.mark.parametrize("seed", range(300))
def test_a_session_opens_as_it_did(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = random_snapshot(random.Random(seed))
    session = Session(snap, POLICY, default_plugins(POLICY))
    now = opened(session)
    holding = [n for n in session.nodes if any(t.gpu_share and not t.gpu_mig for _, t in n.tasks)]
    assert session.fraction_nodes == holding
    with monkeypatch.context() as patched:
        patched.setattr(session_module, "_sort_out", old_sort_out)
        patched.setattr(session_module, "NodeView", OldNodeView)
        before = opened(OldSession(snap, POLICY, default_plugins(POLICY)))
    assert now == before


@pytest.mark.parametrize("seed", range(50))
def test_victims_are_ordered_as_they_were(seed: int) -> None:
    rng = random.Random(seed)
    jobs = random_snapshot(rng).jobs
    for j in jobs:  # and tasks without a start, or starting before the epoch
        for t in j.tasks:
            t.started_at = rng.choice([t.started_at, None, -5.0, 0.0])
    assert [_victim_key(j) for j in jobs] == [old_victim_key(j) for j in jobs]
    assert _victim_key(replace(jobs[0], tasks=[])) == old_victim_key(replace(jobs[0], tasks=[]))


@pytest.mark.parametrize("seed", range(100))
def test_drf_reclaims_from_the_queues_it_did(seed: int) -> None:
    snap = random_snapshot(random.Random(seed))
    session = Session(snap, POLICY, default_plugins(POLICY))
    drf = DRFPlugin()
    victims = list(snap.jobs)
    for reclaimer in snap.jobs:
        assert drf.reclaimable(session, reclaimer, victims) == old_reclaimable(
            drf, session, reclaimer, victims
        )


def decided(snap: Snapshot, config: SchedulingPolicy) -> Any:
    result = run_cycle(snap, config)
    return (
        [(b.job_id, b.task_id, b.node, b.devices, b.action) for b in result.binds],
        [(e.job_id, e.reason, e.preemptor_job_id, e.message) for e in result.evictions],
        {
            i: (s.code, s.message, s.node_reasons, s.estimated_start)
            for i, s in result.pending.items()
        },
    )


@pytest.mark.parametrize("strict", [True, False])
def test_random_clusters_preempt_and_reclaim_as_they_did(
    strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SchedulingPolicy(strict_order=strict)
    evicted = 0
    for seed in range(400):
        snap = random_snapshot(random.Random(seed))
        now = decided(snap, config)
        with monkeypatch.context() as patched:
            patched.setattr(session_module, "_sort_out", old_sort_out)
            patched.setattr(plugins.DRFPlugin, "reclaimable", old_reclaimable)
            patched.setattr(actions, "_evict_one", old_evict_one)
            patched.setattr("scheduler.core.cycle.Session", OldSession)
            patched.setattr(session_module, "NodeView", OldNodeView)
            before = decided(snap, config)
        assert now == before, f"seed {seed}"
        evicted += len(now[1])
    assert evicted > 50  # the clusters do preempt and reclaim


def test_a_gang_keeps_only_the_victims_it_needs() -> None:
    """A whole-node job on nodes full of one-GPU victims, the cheapest spread over the
    nodes: it takes victims until one node is free, then lets go of those on the others."""
    nodes = [node(f"n{i}", gpus=4, cpu=16) for i in range(3)]
    jobs = [
        job(10 * i + d + 1, gpu=1, running_on=[(f"n{i}", (d,))], priority=d)
        for i in range(3)
        for d in range(4)
    ]
    jobs.append(job(100, gpu=4, priority=10))
    result = run_cycle(snapshot(nodes, jobs), POLICY)
    assert sorted(e.job_id for e in result.evictions) == [1, 2, 3, 4]
    assert {e.preemptor_job_id for e in result.evictions} == {100}


def test_fair_share_is_asked_once_per_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """DRF asks whether a queue is above its share once per queue, however many victims."""
    nodes = [node("n0", gpus=8, cpu=64)]
    jobs = [job(i, gpu=1, running_on=[("n0", (i,))], queue="b") for i in range(8)]
    jobs.append(job(20, gpu=1, queue="a"))
    snap = snapshot(nodes, jobs, [QueueInfo("a", weight=4.0), QueueInfo("b")])
    session = Session(snap, POLICY, default_plugins(POLICY))
    actions.enqueue(session)  # (queue "a" has work waiting: it counts)
    asked: list[tuple[Any, ...]] = []

    def counted(*args: Any) -> float:
        asked.append(args[2:])
        return fair_share(*args)

    monkeypatch.setattr(plugins, "fair_share", counted)
    victims = DRFPlugin().reclaimable(session, jobs[-1], jobs[:-1])
    assert [v.id for v in victims] == list(range(8))
    assert asked == [("a",), ("b",)]
