"""Work the cycle does for many jobs or nodes at once gives what it gives one at a time
(issue #21, "Fast"): the backlog's keys in one pass (`Session.key_all`), and a walk of the
node order that hands out the index's own buckets (`Session.walk_once`)."""

from __future__ import annotations

import pytest

from scheduler.core.model import QueueInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.priority import PriorityWeights, age_factor, combine, fair_share_factors
from scheduler.core.session import Session
from tests.core.builders import GI, NOW, job, node, snapshot

WEIGHTS = [
    PriorityWeights(),
    PriorityWeights(age=1000, fair_share=10_000, priority=100),
    PriorityWeights(age=7, fair_share=3, job_size=500, queue=11, priority=0.5, max_age=900),
    PriorityWeights(job_size=1000, favor_small=True, fair_share=1),
]


def _cluster() -> Snapshot:
    nodes = [node(f"n{i}", gpus=4 if i % 3 else 0, cpu=16) for i in range(6)]
    jobs = [
        job(
            i,
            gpu=i % 3,
            cpu=1 + i % 4,
            replicas=1 + i % 2,
            priority=i % 5,
            queue="q1" if i % 2 else "q2",
            owner=f"user-{i % 4}",
            created_at=NOW - 37.5 * i if i % 7 else NOW + 5,  # one from the future
        )
        for i in range(1, 40)
    ]
    queues = [QueueInfo("q1", priority=3), QueueInfo("q2", priority=1)]
    cluster = snapshot(nodes, jobs, queues)
    cluster.usage = {"user-0": 0.0, "user-1": 500.0, "user-2": 12_345.5}
    cluster.shares = {"user-3": 2.0}
    return cluster


def _session(weights: PriorityWeights) -> Session:
    config = SchedulingPolicy(priority_weights=weights)
    return Session(_cluster(), config, default_plugins(config))


@pytest.mark.parametrize("weights", WEIGHTS)
def test_the_backlog_keyed_at_once_has_the_keys_and_factors_of_one_by_one(weights) -> None:
    at_once, one_by_one = _session(weights), _session(weights)
    at_once.key_all(at_once.candidates)
    keys = [at_once.job_key(j) for j in at_once.candidates]
    assert keys == [one_by_one.job_key(j) for j in one_by_one.candidates]
    assert list(at_once.factors.items()) == list(one_by_one.factors.items())
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("weights", WEIGHTS[1:])
def test_the_factors_are_those_combine_makes_of_each_factor(weights) -> None:
    session = _session(weights)
    session.key_all(session.candidates)
    owners = {j.owner for j in session.candidates}
    fair = fair_share_factors(session.usage, session.shares, owners)
    for j in session.candidates:
        size = min(1.0, session.share(session.min_request(j))) if weights.job_size else 0.0
        expected = combine(
            weights,
            age=age_factor(session.now - j.created_at, weights.max_age),
            fair=fair[j.owner] if weights.fair_share else 0.0,
            size=size,
            queue=session.queues[j.queue].info.priority / 3,
            job_priority=j.priority,
        )
        assert session.factors[j.id] == expected, j.id


def test_keying_at_once_leaves_keys_already_made() -> None:
    session = _session(WEIGHTS[1])
    first = session.candidates[0]
    made = session.job_key(first)
    session.now += 86_400  # older now: a key made again would differ
    session.key_all(session.candidates)
    assert session.job_key(first) is made
    assert session.job_key(session.candidates[1]) != _session(WEIGHTS[1]).job_key(
        session.candidates[1]
    )


def test_a_walk_once_gives_the_nodes_of_the_order_and_is_asked_only_while_made() -> None:
    config = SchedulingPolicy()
    nodes = [node(f"n{i}", gpus=i % 3, cpu=8, memory_gi=64) for i in range(9)]
    running = [job(100 + i, gpu=1, cpu=7, running_on=[(f"n{i}", (0,))]) for i in (1, 2, 4)]
    cluster = snapshot(nodes, [job(1, cpu=1), job(2, cpu=2, gpu=1), *running])
    session = Session(cluster, config, default_plugins(config))
    for job_id in (1, 2):
        task = session.pending_tasks(session.jobs[job_id])[0]
        walked = [n.name for n in session.walk_once(task)]
        assert walked == [n.name for n in session.candidate_nodes(task)]
        assert len(walked) > 1
        assert not session.walking_once  # (only while `node_order` makes the order)
    assert session.total.memory == 9 * 64 * GI
