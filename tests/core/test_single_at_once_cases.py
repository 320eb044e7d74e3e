"""Hand-built clusters for the one-task shortcut (`actions._place_single`,
`statement.commit_one`, `_AroundReservation.one`): the cases a random cluster draws seldom
or never, each run both ways (`Session.single_at_once`) under every policy, explained or
not, and required to decide the same: the same binds, statuses, failures, evictions, what
is free on each node, what each queue holds, the session's version, and what the per-user
limits count (`session.bound`). Each case also says the shortcut really placed a job in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import actions, backfill
from scheduler.core.model import (
    JobInfo,
    PriorityWeights,
    QueueInfo,
    SchedulingPolicy,
    Snapshot,
)
from scheduler.core.plugins import UserLimitPlugin, default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Plugin, Session
from scheduler.core.types import NodeView
from tests.core.builders import GI, NOW, POLICIES, job, node, snapshot
from tests.core.test_properties import CONFIGS as ANY_CONFIG
from tests.core.test_properties import FAST, clusters
from tests.core.test_single_at_once import decided, outcome


def decide(snap: Snapshot, config: SchedulingPolicy, single: bool, explain: bool) -> Any:
    """`test_single_at_once.outcome`, and what the fast path touches besides."""
    session, result = decided(snap, config, single, explain)
    return (*outcome(session, result), *touched(session))


def touched(session: Any) -> tuple[Any, ...]:
    """What a fast path touches besides the outcome: the binds in order, the free totals,
    the placed and nominated jobs, and the per-user limits' counts."""
    bound = [(j.id, t.id, n.name, d) for j, t, n, d in session.bound]
    totals = (session.ready_free_cpu, session.ready_free_memory, session.ready_free_gpu)
    limits = [
        (sorted(p.use.items()), sorted(p.counted.items()))
        for p in session.plugins
        if isinstance(p, UserLimitPlugin) and hasattr(p, "use")
    ]
    return bound, totals, sorted(session.placed), sorted(session.nominated), limits


def _labels() -> Snapshot:
    """Node selectors over label groups, with cordoned and NotReady nodes in the group the
    selector picks (first in snapshot order): only the Ready one may take the jobs."""
    nodes = [
        node("c0", gpus=2, cpu=8, labels={"zone": "east"}, state="Cordoned"),
        node("c1", gpus=2, cpu=8, labels={"zone": "east"}, state="NotReady"),
        node("w0", gpus=2, cpu=8, labels={"zone": "west"}),
        node("e0", gpus=2, cpu=4, labels={"zone": "east"}),
        node("p0", gpus=0, cpu=4),
    ]
    jobs = [
        job(1, cpu=2, gpu=1, selector={"zone": "east"}),
        job(2, cpu=2, selector={"zone": "east"}),
        job(3, cpu=1, gpu=1, selector={"zone": "east"}),  # east's cpu is gone: waits
        job(4, cpu=1, selector={"zone": "nowhere"}),  # never fits
        job(5, cpu=2, gpu=2),
        job(6, cpu=1),
        job(7, cpu=1, selector={"zone": "west"}, gpu=1),
    ]
    return snapshot(nodes, jobs)


def _growing() -> Snapshot:
    """Running jobs with tasks still pending: one whose gang needs its last task (need 1,
    one pending task: the shortcut), one past its gang (need 0: extra tasks, the loop)."""
    nodes = [node("n0", gpus=2, cpu=4), node("n1", gpus=2, cpu=4)]
    jobs = [
        job(1, cpu=2, gpu=1, replicas=2, running_on=[("n0", (0,))]),
        job(2, cpu=1, replicas=2, min_available=1, running_on=[("n0", ())]),
        job(3, cpu=1, replicas=3, min_available=3, running_on=[("n1", ()), ("n1", ())]),
        job(4, cpu=1, gpu=1),
        job(5, cpu=4),
    ]
    return snapshot(nodes, jobs)


def _preempting() -> Snapshot:
    """A high-priority job that must evict: the node nominated for it (n0, with room left
    now) is passed over by the one-task jobs placed after it (backfill), in its queue and
    another, which go elsewhere or wait."""
    nodes = [node("n0", gpus=4, cpu=8), node("n1", gpus=2, cpu=4), node("n2", gpus=0, cpu=2)]
    queues = [QueueInfo("default", priority=1), QueueInfo("other")]  # (default first)
    jobs = [
        job(1, cpu=4, gpu=2, running_on=[("n0", (0, 1))], priority=0, preemptible=True),
        job(2, cpu=3, gpu=1, running_on=[("n1", (0,))], priority=0, preemptible=False),
        job(3, cpu=5, gpu=3, priority=5, walltime=600.0),
        job(4, cpu=1, gpu=2, walltime=60.0),
        job(5, cpu=3, walltime=60.0, queue="other"),
        job(6, cpu=1, gpu=1, walltime=7200.0, queue="other"),
        job(7, cpu=2, walltime=60.0),
    ]
    return snapshot(nodes, jobs, queues)


def _user_limits() -> Snapshot:
    """Per-user limits: one-task jobs of one owner fill their limits (jobs, GPUs, cpus);
    an exempt owner and another owner go on."""
    nodes = [node("n0", gpus=4, cpu=16), node("n1", gpus=4, cpu=16)]
    queues = [
        QueueInfo("lim", max_user_jobs=2, max_user_gpus=3),
        QueueInfo("cpus", max_user_cpus=3000, limits_exempt=frozenset({"x"})),
    ]
    jobs = [
        job(1, cpu=1, gpu=2, queue="lim", owner="a"),
        job(2, cpu=1, gpu=1, queue="lim", owner="a"),
        job(3, cpu=1, gpu=1, queue="lim", owner="a"),  # three jobs: over
        job(4, cpu=1, gpu=2, queue="lim", owner="b"),
        job(5, cpu=1, gpu=2, queue="lim", owner="b"),  # four GPUs: over
        job(6, cpu=2, queue="cpus", owner="a"),
        job(7, cpu=2, queue="cpus", owner="a"),  # four cpus: over
        job(8, cpu=2, queue="cpus", owner="x"),
        job(9, cpu=2, queue="cpus", owner="x"),
        job(10, cpu=1, queue="lim", owner="c", running_on=[("n1", ())]),
        job(11, cpu=1, gpu=1, queue="lim", owner="c"),
    ]
    return snapshot(nodes, jobs, queues)


def _limits_and_reservation() -> Snapshot:
    """Per-user limits beside EASY's reservation: the owner's reserved job keeps its room
    under the owner's limits from the owner's one-task jobs backfilled after it."""
    nodes = [node("n0", gpus=2, cpu=8), node("n1", gpus=2, cpu=8)]
    queues = [QueueInfo("lim", max_user_gpus=4)]
    jobs = [
        job(1, cpu=6, gpu=2, running_on=[("n0", (0, 1))], walltime=600.0, queue="lim",
            owner="b", started_at=NOW - 100),
        job(2, cpu=4, gpu=2, replicas=2, walltime=600.0, queue="lim", owner="a"),
        job(3, cpu=1, gpu=1, walltime=60.0, queue="lim", owner="a"),
        job(4, cpu=1, gpu=1, walltime=60.0, queue="lim", owner="b"),
        job(5, cpu=1, walltime=60.0, queue="lim", owner="a"),
    ]  # fmt: skip
    return snapshot(nodes, jobs, queues)


def _capability_and_shares() -> Snapshot:
    """Queues with weights (DRF: the queue served next changes with every start) and one
    with a capability (its one-task jobs go through the loop), several owners."""
    nodes = [node(f"n{i}", gpus=2, cpu=4, memory_gi=16) for i in range(4)]
    queues = [
        QueueInfo("a", weight=1.0),
        QueueInfo("b", weight=3.0),
        QueueInfo("capped", capability=Resources(2000, 64 * GI, 1)),
    ]
    jobs = []
    for i in range(1, 19):
        queue = ("a", "b", "capped")[i % 3]
        jobs.append(
            job(i, cpu=(1, 2, 0.5)[i % 3], gpu=i % 2, memory_gi=(1, 4, 8)[i % 3], queue=queue,
                owner="uvw"[i % 3], priority=i % 4)
        )  # fmt: skip
    return snapshot(nodes, jobs, queues)


def _reservation() -> Snapshot:
    """EASY: a blocked gang's reservation, and one-task jobs that end before its start or
    must fit around it (whole GPUs, cpu only, memory only), some of which it has no room
    for, on nodes its plan takes and nodes it leaves."""
    nodes = [node("n0", gpus=4, cpu=8, memory_gi=32), node("n1", gpus=4, cpu=8, memory_gi=32),
             node("n2", gpus=0, cpu=4, memory_gi=8)]  # fmt: skip
    jobs = [
        job(1, cpu=4, gpu=3, running_on=[("n0", (0, 1, 2))], walltime=1000.0,
            started_at=NOW - 500),
        job(2, cpu=4, gpu=3, running_on=[("n1", (0, 1, 2))], walltime=3000.0,
            started_at=NOW - 500),
        job(3, cpu=6, gpu=4, replicas=1, walltime=600.0),  # blocked: the holder
        job(4, cpu=1, gpu=1, walltime=7200.0),  # past it: only where the holder is not
        job(5, cpu=1, gpu=1, walltime=60.0),  # ends before the start
        job(6, cpu=2, walltime=7200.0),
        job(7, cpu=3, walltime=7200.0, memory_gi=30),
        job(8, cpu=0.5, memory_gi=0, walltime=7200.0),
        job(9, cpu=1, walltime=None),
        job(10, cpu=2, gpu=1, walltime=None),
    ]  # fmt: skip
    return snapshot(nodes, jobs)


def _reservation_memory() -> Snapshot:
    """EASY's reservation short of memory, not cpu: a one-task job that runs past its start
    fits the first node now and in its spare cpu, not in its spare memory (it goes to n1)."""
    nodes = [node("n0", cpu=8, memory_gi=32), node("n1", cpu=2, memory_gi=8)]
    jobs = [
        job(1, cpu=7, memory_gi=1, running_on=[("n0", ())], walltime=1000.0,
            started_at=NOW - 500),
        job(2, cpu=2, memory_gi=31, walltime=600.0),  # blocked by cpu: the holder
        job(3, cpu=1, memory_gi=4, walltime=7200.0),
        job(4, cpu=1, memory_gi=1, walltime=7200.0),
    ]  # fmt: skip
    return snapshot(nodes, jobs)


def _suspended() -> Snapshot:
    """Suspended jobs to be placed again, jobs being suspended (they hold what they run on
    until released, and are no candidates), and Releasing tasks."""
    nodes = [node("n0", gpus=2, cpu=4), node("n1", gpus=2, cpu=4)]
    jobs = [
        job(1, cpu=2, gpu=1, state="Suspended"),
        job(2, cpu=2, gpu=1, running_on=[("n0", (0,))], suspend_requested=True),
        job(3, cpu=1, state="Suspended", priority=2),
        job(4, cpu=2, gpu=1),
        job(5, cpu=1, gpu=1),
    ]
    releasing = job(6, cpu=2, gpu=1, running_on=[("n1", (1,))])
    releasing.tasks[0].state = "Releasing"
    return snapshot(nodes, [*jobs, releasing])


def _priority_factors() -> Snapshot:
    """The multifactor order (age, fair share, size, queue priority) decides which one-task
    job comes first; several owners with usage and shares."""
    nodes = [node("n0", gpus=2, cpu=4), node("n1", gpus=1, cpu=2)]
    queues = [QueueInfo("default"), QueueInfo("high", priority=5)]
    jobs = [
        job(i, cpu=(1, 2)[i % 2], gpu=i % 2, owner="abc"[i % 3], created_at=NOW - 1000 * i,
            queue=("default", "high")[i % 4 == 0], priority=i % 3)
        for i in range(1, 11)
    ]  # fmt: skip
    return Snapshot(NOW, nodes, queues, jobs, {"a": 1e6, "b": 10.0}, {"c": 3.0})


def _mixed_fractions() -> Snapshot:
    """Fractions and MIG instances (never the shortcut) between whole-GPU one-task jobs on
    the same nodes."""
    nodes = [
        node("s0", gpus=2, cpu=8, sharing=("timeslice",), gpu_memory_gi=40),
        node("m0", gpus=1, cpu=8, mig={0: ["1g.10gb", "1g.10gb", "2g.20gb"]}),
        node("w0", gpus=2, cpu=8),
    ]
    jobs = [
        job(1, cpu=1, share=500),
        job(2, cpu=1, gpu=1),
        job(3, cpu=1, mig="1g.10gb"),
        job(4, cpu=1, share=250, replicas=2),
        job(5, cpu=1, gpu=1),
        job(6, cpu=1, gpu=2),
        job(7, cpu=1, mig="2g.20gb"),
        job(8, cpu=1, gpu=1),
    ]
    return snapshot(nodes, jobs)


def _devices_fragmented() -> Snapshot:
    """Free devices not contiguous (a running task holds the middle ones): the devices a
    one-task job gets, and the node's move in the free-device index."""
    nodes = [node("n0", gpus=8, cpu=16), node("n1", gpus=4, cpu=16)]
    jobs = [
        job(1, cpu=1, gpu=2, running_on=[("n0", (2, 3))]),
        job(2, cpu=1, gpu=1, running_on=[("n1", (0,))]),
        job(3, cpu=1, gpu=3),
        job(4, cpu=1, gpu=2),
        job(5, cpu=1, gpu=2),
        job(6, cpu=1, gpu=1),
        job(7, cpu=1, gpu=4),
    ]
    return snapshot(nodes, jobs)


CASES: dict[str, Callable[[], Snapshot]] = {
    "labels": _labels,
    "growing": _growing,
    "preempting": _preempting,
    "user_limits": _user_limits,
    "limits_and_reservation": _limits_and_reservation,
    "capability_and_shares": _capability_and_shares,
    "reservation": _reservation,
    "reservation_memory": _reservation_memory,
    "suspended": _suspended,
    "priority_factors": _priority_factors,
    "mixed_fractions": _mixed_fractions,
    "devices_fragmented": _devices_fragmented,
}
CONFIGS = {
    **POLICIES,
    "factors": SchedulingPolicy(
        priority_weights=PriorityWeights(age=10.0, fair_share=100.0, job_size=5.0, queue=50.0)
    ),
    "factors_easy": SchedulingPolicy(
        actions=("enqueue", "allocate", "backfill"),
        priority_weights=PriorityWeights(fair_share=100.0, job_size=5.0, favor_small=True),
    ),
    "no_drf": SchedulingPolicy(fair_share=False),
}


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_built_clusters_place_single_tasks_as_the_task_loop(
    case: str, config: str, explain: bool
) -> None:
    policy = CONFIGS[config]
    snap = CASES[case]()  # (one snapshot for both: task ids come from a counter)
    assert decide(snap, policy, True, explain) == decide(snap, policy, False, explain)


def count_successes(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, into: list[int] | None = None
) -> list[int]:
    """Wrap `owner.name` (a shortcut called with a job second and answering whether it
    placed it) so that each job it places adds its id to the list returned (`into`, or a
    new one): the list fills as the shortcut works."""
    placed: list[int] = [] if into is None else into
    shortcut = getattr(owner, name)

    def counting(first: Any, job: JobInfo, *args: Any) -> bool:
        done = bool(shortcut(first, job, *args))
        if done:
            placed.append(job.id)
        return done

    monkeypatch.setattr(owner, name, counting)
    return placed


def _count_shortcuts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the jobs `_place_single` places from now on, or backfill's
    `_start_single` (`_place_single` spelled out) starts (the list fills as they do)."""
    placed = count_successes(monkeypatch, actions, "_place_single")
    return count_successes(monkeypatch, backfill._Backfill, "_start_single", placed)


class _Odd(Plugin):
    """Plugins that turn the shortcut off or change what it may rely on: a predicate the
    index does not answer, a node order that reads free cpu, a `job_ready` that refuses."""

    name = "odd"

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def predicate(self, session: Session, job: JobInfo, task: Any, node: NodeView) -> str | None:
        if self.hook == "predicate" and node.name == "n0" and job.id % 2:
            return "odd jobs avoid n0"
        return None

    def job_ready(self, session: Session, job: JobInfo, placed: int) -> bool:
        return self.hook != "job_ready" or placed >= 1


def _plugin_case() -> Snapshot:
    nodes = [node("n0", gpus=2, cpu=4), node("n1", gpus=2, cpu=4)]
    jobs = [job(i, cpu=1, gpu=i % 2, replicas=1 + (i % 3 == 0)) for i in range(1, 9)]
    return snapshot(nodes, jobs)


@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("hook", ["predicate", "job_ready"])
def test_extra_plugins_place_single_tasks_as_the_task_loop(hook: str, explain: bool) -> None:
    policy = SchedulingPolicy(
        actions=("enqueue", "allocate", "backfill"), extra_plugins=(_Odd(hook),)
    )
    snap = _plugin_case()
    assert decide(snap, policy, True, explain) == decide(snap, policy, False, explain)


def test_growing_job_needs_its_last_task_through_the_shortcut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Job 1 of `_growing` (a running gang missing one task) is placed by the shortcut."""
    placed = _count_shortcuts(monkeypatch)
    decide(_growing(), POLICIES["default"], True, True)
    assert 1 in placed and 2 not in placed


# --- the other shortcuts of the same round, each beside its long way ---------------------


def _holding_candidates() -> Snapshot:
    """Candidates that hold something (a Pending job whose task is still Releasing, a
    growing gang, a Suspended job with a task Assigned) beside ones that hold nothing, and
    jobs that are no candidates (being suspended, Releasing)."""
    nodes = [node("n0", gpus=2, cpu=8), node("n1", gpus=2, cpu=8, sharing=("timeslice",))]
    requeued = job(1, cpu=2, gpu=1, replicas=2, running_on=[("n0", (1,))], state="Pending")
    requeued.tasks[0].state = "Releasing"
    suspended = job(2, cpu=1, replicas=2, running_on=[("n1", ())], state="Suspended")
    suspended.tasks[0].state = "Assigned"
    jobs = [
        requeued,
        suspended,
        job(3, cpu=1, gpu=1, replicas=3, running_on=[("n1", (0,))]),  # growing
        job(4, cpu=1, share=500, replicas=2, running_on=[("n1", (1,))]),  # growing fraction
        job(5, cpu=1, gpu=1, running_on=[("n0", (0,))], suspend_requested=True),
        job(6, cpu=2),
        job(7, cpu=1, gpu=1, queue="other"),
    ]
    return snapshot(nodes, jobs, [QueueInfo("default"), QueueInfo("other")])


def _opened(snap: Snapshot, every_job: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What a session opened on `snap` loads: per node what is free and releasing and its
    tasks, per queue what it holds, and the totals; `every_job`: loading every job, as
    before the open pass passed over candidates that hold nothing."""
    from scheduler.core import session as session_module

    sort_out = session_module._sort_out

    def all_holders(jobs: list[JobInfo]) -> Any:
        found = sort_out(jobs)
        return (*found[:4], list(jobs))

    with monkeypatch.context() as patched:
        if every_job:
            patched.setattr(session_module, "_sort_out", all_holders)
        config = SchedulingPolicy()
        session = Session(snap, config, default_plugins(config))
    nodes = [
        (n.name, n.free(), n.releasing(), n.free_devices, dict(n.shared),
         [(j.id, t.id) for j, t in n.tasks])
        for n in session.nodes
    ]  # fmt: skip
    queues = {name: (q.allocated, q.shared_gpu) for name, q in session.queues.items()}
    totals = (session.ready_free_cpu, session.ready_free_memory, session.ready_free_gpu)
    return nodes, queues, totals, session.walltime_ends, session.releasing


@pytest.mark.parametrize("case", sorted([*CASES, "holding_candidates"]))
def test_the_open_pass_loads_what_loading_every_job_did(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _holding_candidates() if case == "holding_candidates" else CASES[case]()
    assert _opened(snap, False, monkeypatch) == _opened(snap, True, monkeypatch)


@pytest.mark.parametrize("case", sorted([*CASES, "holding_candidates"]))
def test_node_kinds_give_every_node_its_own_reason(case: str) -> None:
    """`_reasons_by_kind` (kinds numbered once) says of each node what `node_reason` does."""
    snap = _holding_candidates() if case == "holding_candidates" else CASES[case]()
    config = SchedulingPolicy()
    session = Session(snap, config, default_plugins(config))
    asked = 0
    for candidate in session.candidates:
        for task in session.pending_tasks(candidate):
            expected = [session.node_reason(candidate, task, n) for n in session.nodes]
            assert session._reasons_by_kind(candidate, task) == expected, (case, candidate.id)
            asked += 1
    assert asked


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("policy", ["easy", "default"])
def test_a_replayed_trace_starts_the_same_jobs_both_ways(
    policy: str, incremental: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standing session kept from cycle to cycle (its own binds applied through
    `session.bound`), and full cycles, on a generated GPU trace (fair share, a capability,
    priorities, gangs, node selectors, a cordoned node): the same schedule and promised
    reservations with the shortcut as without it."""
    from scheduler.core.replay import replay
    from tests.core.test_replay import generated_cluster, generated_trace, schedule

    jobs = generated_trace(5, 120)
    nodes, queues = generated_cluster()
    shortcut = replay(jobs, nodes, queues, POLICIES[policy], incremental=incremental)
    open_shortcuts = Session._open_shortcuts

    def without(self: Session) -> None:
        open_shortcuts(self)
        self.single_at_once = False

    monkeypatch.setattr(Session, "_open_shortcuts", without)
    loop = replay(jobs, nodes, queues, POLICIES[policy], incremental=incremental)
    assert schedule(jobs, shortcut) == schedule(jobs, loop)
    assert shortcut.first_reservation == loop.first_reservation
    assert len(shortcut.starts) > 50


@FAST
@given(clusters(fraction_gangs=True), ANY_CONFIG, st.booleans())
def test_whole_gpu_jobs_beside_fractions_place_as_the_task_loop(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    """Shared devices everywhere: the one-task whole-GPU jobs among gangs of fractions
    (which take the loop) bind as the loop binds them."""
    assert decide(snap, config, True, explain) == decide(snap, config, False, explain)


@FAST
@given(clusters(mig=True), ANY_CONFIG, st.booleans())
def test_cpu_jobs_beside_mig_instances_place_as_the_task_loop(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    """GPUs cut into MIG instances: the one-task jobs asking no GPU among gangs of
    instances (which take the loop) bind as the loop binds them."""
    assert decide(snap, config, True, explain) == decide(snap, config, False, explain)
