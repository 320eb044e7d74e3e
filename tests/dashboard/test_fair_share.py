"""The fair shares the pages show are the ones the scheduler reclaims by: a queue's weight
among the queues the scheduler counts (with a job it may place or a task on a node), never
among every queue there is."""

from __future__ import annotations

import re

import pytest

from scheduler.core.actions import enqueue
from scheduler.core.model import SchedulingPolicy
from scheduler.core.plugins import DRFPlugin
from scheduler.core.session import Session
from scheduler.cycle.snapshot import load_snapshot
from scheduler.models import Job, Queue
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def shown_fair_shares(html: str) -> dict[str, int]:
    found = re.findall(r"([^\s\"]+) uses \d+% against a fair share of (\d+)%", html)
    return {name: int(fair) for name, fair in found}


def scheduler_fair_shares() -> dict[str, int]:
    plugin = DRFPlugin()
    session = Session(load_snapshot().snapshot, SchedulingPolicy(), [plugin])
    enqueue(session)  # the cycle's first action: what reclaim then counts
    return {name: round(100 * plugin.deserved(session, name)) for name in session.queues}


def test_an_idle_queue_does_not_shrink_the_busy_queues_share(owner, signed_in):
    Queue.objects.create(name="research", weight=3)
    Queue.objects.create(name="idle", weight=6)
    Queue.objects.create(name="closed", weight=2, open=False)
    node = make_node("gpu-01", gpus=2)
    place(make_job(owner, gpu=2), node, devices=2)
    make_job(owner, "waiting", queue="research")
    make_job(owner, "refused", queue="closed")  # admitted, never placed: counted
    held = make_job(owner, "held", queue="idle")  # held back (a flow's parallelism): not counted
    Job.objects.filter(pk=held.pk).update(hold_reason="waiting for a parallelism slot")
    shown = shown_fair_shares(signed_in(owner).get("/queues/").content.decode())
    assert shown == {"closed": 33, "default": 17, "idle": 50, "research": 50}
    assert shown == scheduler_fair_shares()


def test_a_preempted_job_keeps_its_queue_counted_and_a_user_suspended_one_does_not(
    owner, signed_in
):
    Queue.objects.create(name="research", weight=3)
    Queue.objects.create(name="paused", weight=1)
    place(make_job(owner, gpu=1), make_node("gpu-01", gpus=1), devices=1)
    preempted = make_job(owner, "preempted", queue="research")
    paused = make_job(owner, "paused", queue="paused")
    Job.objects.filter(pk=preempted.pk).update(state=JobState.SUSPENDED, reason="Preempted")
    Job.objects.filter(pk=paused.pk).update(state=JobState.SUSPENDED, reason="UserSuspended")
    shown = shown_fair_shares(signed_in(owner).get("/").content.decode())
    assert shown == {"default": 25, "paused": 20, "research": 75}
    assert shown == scheduler_fair_shares()
