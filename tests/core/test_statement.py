"""A statement keeps or undoes a job's binds and evictions together."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core.model import SchedulingPolicy
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session
from scheduler.core.statement import Statement
from scheduler.core.types import Bind, new_bind
from tests.core.builders import job, node, snapshot


def open_session() -> Session:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    jobs = [
        job(1, gpu=2, priority=0, running_on=[("a", (0, 1))]),  # the victim
        job(2, gpu=2, priority=10),  # the preemptor
    ]
    policy = SchedulingPolicy()
    return Session(snapshot(nodes, jobs), policy, default_plugins(policy))


def state(session: Session) -> tuple[object, ...]:
    a, b = session.node_by_name["a"], session.node_by_name["b"]
    return (
        (a.free(), a.releasing(), b.free(), b.releasing()),
        session.queues["default"].allocated,
        set(session.evicted),
        list(session.binds),
        list(session.evictions),
        set(session.placed),
    )


def act(session: Session) -> Statement:
    victim, preemptor = session.jobs[1], session.jobs[2]
    statement = Statement(session)
    statement.evict(victim, "Preempted", preemptor)
    statement.allocate(preemptor, preemptor.tasks[0], session.node_by_name["b"])
    return statement


def test_discard_undoes_binds_and_evictions_alike():
    session = open_session()
    before = state(session)
    statement = act(session)
    # Applied to the session as they are made: the victim's GPUs count as releasing.
    assert session.node_by_name["a"].releasing() == Resources(1000, 1 << 30, 2)
    assert session.evicted == {1}
    statement.discard()
    assert state(session) == before


def test_commit_keeps_binds_and_evictions_alike():
    session = open_session()
    act(session).commit("preempt")
    assert [(e.job_id, e.reason, e.preemptor_job_id) for e in session.evictions] == [
        (1, "Preempted", 2)
    ]
    assert [(b.job_id, b.node, b.devices) for b in session.binds] == [(2, "b", (0, 1))]
    assert session.evicted == {1}
    assert session.placed == {2}
    # The queue holds the preemptor's task and no longer the victim's.
    assert session.queues["default"].allocated == Resources(1000, 1 << 30, 2)


def test_a_bind_made_without_its_init_is_a_bind_like_any_other():
    made = new_bind(7, 70, "n1", (0, 1), "backfill")
    plain = Bind(7, 70, "n1", (0, 1), "backfill")
    assert type(made) is Bind
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert vars(made) == vars(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.node = "n2"  # type: ignore[misc]
