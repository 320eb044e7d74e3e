"""Enqueue's shortcuts of 2026-11-28 (branch `order`, issue #21) decide as the long way does:

- the priority plugin makes each job's key with its id in one tuple, and its factors, in one
  pass over the backlog (`PriorityPlugin.keys_with_ids`: each owner's and queue's factor
  looked up by itself, `Factors` a named tuple made without its `__new__`), and a fresh
  session sorts the keys it was handed without looking them up again (`Session.key_all`);
- enqueue asks whether each job waits in one pass (`Session.have_pending`) and, where no
  job need be asked `job_valid`, puts the jobs into their queues without a test per job
  (`actions._admit`);
- a fresh session's keys are sorted by their first items, each run of equal ones then by
  the whole keys (`sorted_by_first`: one float against another rather than a tuple);
- the alike keys are made in one loop from each job's pending tasks (`pending_shape`), and
  `shape` reads a job's shape off its alike key rather than keeping its own.

A backlog's keys, factors (values and order), queues and statuses are checked against
their definitions (`combine`, `fair_share_factors`, `sorted` by the keys, `job_valid` job
by job), and whole cycles against a session with the shortcuts undone."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import actions
from scheduler.core.actions import enqueue
from scheduler.core.cycle import run_actions
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.priority import (
    Factors,
    PriorityWeights,
    age_factor,
    combine,
    fair_share_factors,
)
from scheduler.core.resources import Resources
from scheduler.core.session import Session, pending_shape, sorted_by_first, task_shape
from scheduler.core.status import Code
from tests.core.builders import GI, NOW, job, node
from tests.core.test_alike_at_once import random_snapshot
from tests.core.test_alike_refusals import alike_clusters
from tests.core.test_properties import CONFIGS, FAST, WEIGHTS, clusters
from tests.core.test_single_at_once import outcome

OWNERS = ["a", "b", "c", "d", "e"]
# Queues of several priorities (the queue factor), one closed and one capped (jobs there
# are asked `job_valid`); jobs also name a queue that does not exist.
ALL_QUEUES = [
    QueueInfo("hi", weight=2, priority=5),
    QueueInfo("lo", weight=1, priority=1),
    QueueInfo("zero", weight=1, priority=0),
    QueueInfo("shut", open=False),
    QueueInfo("capped", capability=Resources(2000, 8 * GI, 1)),
]


@st.composite
def backlogs(draw: st.DrawFn) -> Snapshot:
    """A backlog over several queues and owners, with ties: jobs of one owner, queue,
    size, priority and age (their keys then differ in the id alone), jobs from the future
    and from long ago (an age factor of 0 and of 1), now and then a job already running
    part of its gang, now and then one whose pending tasks differ, usage and shares."""
    queues = draw(
        st.sampled_from(
            [ALL_QUEUES, ALL_QUEUES[:1], ALL_QUEUES[:3], [ALL_QUEUES[1], ALL_QUEUES[3]]]
        )
    )
    names = [q.name for q in queues]
    nodes = [node("n0", gpus=2, cpu=8), node("n1", cpu=4)]
    jobs = []
    for i in range(1, draw(st.integers(0, 40))):
        replicas = draw(st.integers(1, 3))
        running = draw(st.integers(0, 4)) == 0 and replicas > 1
        jobs.append(
            job(
                i,
                gpu=draw(st.integers(0, 1)),
                cpu=draw(st.sampled_from([1, 1, 2])),
                replicas=replicas,
                priority=draw(st.sampled_from([0, 0, 1, 3])),
                queue=draw(st.sampled_from([*names, *names, "nowhere"])),
                owner=draw(st.sampled_from(OWNERS)),
                created_at=draw(
                    st.sampled_from([NOW - 100, NOW - 100, NOW - 3.5, NOW, NOW + 7, NOW - 1e7])
                ),
                selector=draw(st.sampled_from([None, None, {"zone": "a"}])),
                running_on=[("n1", ())] if running else None,
                state="Running" if running else None,
            )
        )
        last = jobs[-1].tasks[-1]
        if replicas > 1 and draw(st.integers(0, 3)) == 0:  # pending tasks not all alike
            if draw(st.booleans()):
                last.resources = Resources(3000, GI, last.resources.gpu)
            else:
                last.node_selector = {"zone": "b"}
    usage = {o: draw(st.sampled_from([0.0, 10.0, 1e6])) for o in OWNERS[:3]}
    shares = draw(st.sampled_from([{}, {"a": 3.0}, {"b": 0.0}]))
    return Snapshot(NOW, nodes, queues, jobs, usage, shares)


def _reference_keys(session: Session) -> tuple[dict[int, tuple[Any, ...]], dict[int, Factors]]:
    """Each candidate's key (with its id) and factors as their definitions say, job by job
    in snapshot order (the order the factors are recorded in)."""
    weights = session.config.priority_weights
    keys: dict[int, tuple[Any, ...]] = {}
    factors: dict[int, Factors] = {}
    owners = {j.owner for j in session.candidates}
    fair = fair_share_factors(session.usage, session.shares, owners)
    top = max((q.info.priority for q in session.queues.values()), default=0)
    for j in session.candidates:
        if weights.off:
            keys[j.id] = (-j.priority, j.created_at, j.id)
            continue
        queue = session.queues.get(j.queue)
        priority = queue.info.priority if queue is not None else 0
        made = factors[j.id] = combine(
            weights,
            age=age_factor(session.now - j.created_at, weights.max_age),
            fair=fair[j.owner] if weights.fair_share else 0.0,
            size=min(1.0, session.share(session.min_request(j))) if weights.job_size else 0.0,
            queue=max(0, priority) / top if top > 0 else 0.0,
            job_priority=j.priority,
        )
        keys[j.id] = (-made.priority, -j.priority, j.created_at, j.id)
    return keys, factors


def _session(snap: Snapshot, config: SchedulingPolicy) -> Session:
    return Session(snap, config, default_plugins(config))


def _admitted(session: Session) -> tuple[Any, ...]:
    queues = {name: [j.id for j in q.jobs] for name, q in session.queues.items()}
    pending = [(i, s.code, s.message) for i, s in session.pending.items()]
    failures = [(i, f.code, f.message) for i, f in session.failures.items()]
    return queues, pending, failures


def _enqueue_by_definition(session: Session, keys: dict[int, tuple[Any, ...]]) -> None:
    """Enqueue as its docstring says: in key order, each job asked `job_valid`; a valid
    job with a pending task into its queue, an invalid one pending with the reason."""
    for j in sorted(session.candidates, key=lambda j: keys[j.id]):
        invalid = session.job_valid(j)
        if invalid is None:
            if [t for t in j.tasks if t.state == "Pending"]:
                session.queues[j.queue].jobs.append(j)
            continue
        session.set_pending(j, invalid)
        session.failures[j.id] = actions.Failure(invalid.code, invalid.message, False)


def _check_enqueue(snap: Snapshot, config: SchedulingPolicy) -> None:
    fast = _session(snap, config)
    enqueue(fast)
    slow = _session(snap, config)
    keys, factors = _reference_keys(slow)
    _enqueue_by_definition(slow, keys)
    assert _admitted(fast) == _admitted(slow)
    assert {i: fast.job_key(fast.jobs[i]) for i in keys} == keys
    # The factors: equal, recorded in the same order, shown the same (the digest's repr).
    assert list(fast.factors.items()) == list(factors.items())
    assert repr(list(fast.factors.items())) == repr(list(factors.items()))
    assert all(type(f) is Factors for f in fast.factors.values())
    for j in fast.candidates:
        pending = [t for t in j.tasks if t.state == "Pending"]
        shapes = {task_shape(t) for t in pending}
        shape = shapes.pop() if len(shapes) == 1 else None
        assert fast.shape(j) == shape
        owner = j.owner if j.queue in fast.user_limited else ""
        alike = None if shape is None else (shape, j.queue, fast.needed(j), owner)
        assert fast.alike_key(j) == alike


FACTORS = [
    PriorityWeights(),
    PriorityWeights(age=1000, fair_share=10_000, priority=100),
    PriorityWeights(age=7, fair_share=3, job_size=500, queue=11, priority=0.5, max_age=900),
    PriorityWeights(job_size=1000, favor_small=True, fair_share=1),
    PriorityWeights(queue=10),
]


@FAST
@given(backlogs(), st.sampled_from(FACTORS) | WEIGHTS)
def test_enqueue_keys_orders_and_admits_as_the_definitions_say(
    snap: Snapshot, weights: PriorityWeights
) -> None:
    _check_enqueue(snap, SchedulingPolicy(priority_weights=weights))


@FAST
@given(clusters(), CONFIGS)
def test_enqueue_of_any_cluster_is_as_the_definitions_say(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    _check_enqueue(snap, config)


def _long_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo the shortcuts: keys made job by job (`job_key`) and sorted by `sorted`, each
    job's pending tasks asked by `pending_tasks`, every admitted job put into its queue by
    name, alike keys made only when asked, and shapes kept by `shape` itself."""
    monkeypatch.setattr(Session, "key_all", lambda self, jobs: None)
    monkeypatch.setattr(
        Session, "have_pending", lambda self, jobs: [bool(self.pending_tasks(j)) for j in jobs]
    )

    def admit(session: Session, jobs: list[JobInfo], queue_of: Any, at: Any, names: Any) -> None:
        for i in at:
            session.queues[jobs[i].queue].jobs.append(jobs[i])

    monkeypatch.setattr(actions, "_admit", admit)
    monkeypatch.setattr(Session, "prefill_alike_keys", lambda self, jobs: None)

    def shape(self: Session, job: JobInfo) -> Any:
        known = self._shapes.get(job.id, self)
        return self._new_shape(job) if known is self else known

    monkeypatch.setattr(Session, "shape", shape)


def _decided(snap: Snapshot, config: SchedulingPolicy) -> tuple[Any, ...]:
    session = _session(snap, config)
    result = run_actions(session)
    factors = repr(list(result.factors.items()))
    return outcome(session, result), list(result.pending), factors, _admitted(session)


def _both_ways(snap: Snapshot, config: SchedulingPolicy) -> tuple[Any, Any]:
    fast = _decided(snap, config)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _long_way(monkeypatch)
        slow = _decided(snap, config)
    return fast, slow


@pytest.mark.parametrize("weights", FACTORS)
def test_random_clusters_decide_as_the_long_way(weights: PriorityWeights) -> None:
    placed = 0
    for seed in range(60):
        snap = random_snapshot(random.Random(seed))
        snap.usage = {"u": 5.0}
        fast, slow = _both_ways(snap, SchedulingPolicy(priority_weights=weights))
        assert fast == slow, f"seed {seed}"
        placed += len(fast[0][0])
    assert placed > 100


@FAST
@given(backlogs(), st.sampled_from(FACTORS) | WEIGHTS)
def test_backlogs_decide_as_the_long_way(snap: Snapshot, weights: PriorityWeights) -> None:
    fast, slow = _both_ways(snap, SchedulingPolicy(priority_weights=weights))
    assert fast == slow


@FAST
@given(clusters(), CONFIGS)
def test_any_cluster_decides_as_the_long_way(snap: Snapshot, config: SchedulingPolicy) -> None:
    fast, slow = _both_ways(snap, config)
    assert fast == slow


@FAST
@given(alike_clusters(), CONFIGS)
def test_alike_clusters_decide_as_the_long_way(snap: Snapshot, config: SchedulingPolicy) -> None:
    fast, slow = _both_ways(snap, config)
    assert fast == slow


def test_factors_look_and_compare_as_the_frozen_dataclass_did() -> None:
    """What the digest, the loop (`fairshare.stored`) and tests read of a `Factors`."""
    made = combine(PriorityWeights(age=2, queue=1), 0.25, 0.5, 0.0, 1.0, 3)
    assert repr(made) == (
        "Factors(priority=1.5, age=0.25, fair_share=0.5, job_size=0.0, queue=1.0, job_priority=3)"
    )
    assert made == Factors(1.5, 0.25, 0.5, 0.0, 1.0, 3)
    assert made != Factors(1.5, 0.25, 0.5, 0.0, 1.0, 2)
    assert hash(made) == hash(Factors(1.5, 0.25, 0.5, 0.0, 1.0, 3))
    assert made.as_dict() == {
        "priority": 1.5,
        "age": 0.25,
        "fair_share": 0.5,
        "job_size": 0.0,
        "queue": 1.0,
        "job_priority": 3,
    }
    with pytest.raises(AttributeError):
        made.priority = 2.0  # type: ignore[misc]


def test_a_newcomer_moves_every_owner_s_fair_share_from_then_on() -> None:
    """An owner the plugin did not open with (a standing session's newcomer) has every
    owner's fair-share factor worked out again: the jobs keyed after it get the new
    factors, those keyed before keep theirs."""
    config = SchedulingPolicy(priority_weights=PriorityWeights(fair_share=100))
    jobs = [job(1, owner="a"), job(2, owner="a")]
    snap = Snapshot(NOW, [node("n0")], [QueueInfo("default")], jobs, {"a": 10.0, "b": 30.0})
    session = _session(snap, config)
    session.key_all(jobs[:1])
    before = session.factors[1]
    newcomer = job(3, owner="c")
    session.key_all([newcomer, jobs[1]])
    fair = fair_share_factors(snap.usage, {}, {"a", "c"})
    assert session.factors[3].fair_share == fair["c"]
    assert session.factors[2].fair_share == fair["a"] != before.fair_share


def test_pending_shape_is_the_shape_of_alike_tasks_or_none() -> None:
    one = job(1, cpu=2, selector={"zone": "a"}).tasks
    same = job(2, cpu=2, replicas=3).tasks
    mixed = job(3, replicas=2).tasks
    mixed[1].resources = Resources(5, 5, 0)
    assert pending_shape(one) == task_shape(one[0])
    assert pending_shape(same) == task_shape(same[0])
    assert pending_shape(mixed) is None
    assert pending_shape([]) is None


def test_a_job_whose_queue_must_be_asked_still_is() -> None:
    """A backlog with one job outside the queues every job is valid in goes the loop's
    way: that job is refused, the others admitted in key order."""
    jobs = [job(1, queue="hi"), job(2, queue="nowhere"), job(3, queue="hi", priority=2)]
    snap = Snapshot(NOW, [node("n0")], ALL_QUEUES, jobs)
    session = _session(snap, SchedulingPolicy())
    enqueue(session)
    assert [j.id for j in session.queues["hi"].jobs] == [3, 1]
    assert session.pending[2].code == Code.QUEUE_MISSING


NUMBERS = [-1.0, -0.0, 0.0, 0.5, 2, float("inf"), float("-inf"), float("nan")]


@FAST
@given(
    st.lists(
        st.tuples(
            st.sampled_from(NUMBERS) | st.floats(-1, 1),
            st.integers(0, 2),
            st.sampled_from([1.0, 2.0]),
            st.integers(0, 3),
        ),
        max_size=40,
    )
)
def test_sorted_by_first_is_sorted(keys: list[tuple[Any, ...]]) -> None:
    """Any keys whose NaNs come first (two may be equal: both sorts are stable)."""
    assert sorted_by_first(keys) == sorted(range(len(keys)), key=keys.__getitem__)


@pytest.mark.parametrize("weights", FACTORS)
def test_a_backlog_from_nan_o_clock_is_sorted_as_sorted_sorts_it(weights: PriorityWeights) -> None:
    """A job created at NaN has a NaN priority (and a NaN third item): the keys are sorted
    by `sorted` itself, whatever it makes of them."""
    times = [NOW - 5, float("nan"), NOW - 5, NOW, float("nan"), NOW - 100, NOW - 5]
    jobs = [job(i, created_at=t, owner=OWNERS[i % 2]) for i, t in enumerate(times, 1)]
    snap = Snapshot(NOW, [node("n0")], [QueueInfo("default")], jobs, {"a": 1.0})
    config = SchedulingPolicy(priority_weights=weights)
    fast, slow = _session(snap, config), _session(snap, config)
    keys = [slow.job_key(j) for j in slow.candidates]
    assert fast.key_order(fast.candidates) == sorted(range(len(keys)), key=keys.__getitem__)
