"""Held leases: orders reach a waiting agent when the scheduler commits them, not at its next
lease renewal. The ASGI app serves the lease as the web server would; the scheduler's cycle
runs in a worker thread, as in `./run up` (in-memory channel layer) or through Redis."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from berth.asgi import application
from scheduler.agent.client import PROTOCOL
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job, Node, Queue
from scheduler.states.names import JobRequest, TaskState
from tests.conftest import CI
from tests.factories import make_job, make_node, place

ROOT = Path(__file__).resolve().parents[2]
AN_HOUR = 3600.0


@pytest.fixture(params=["memory", "redis"])
def layer(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    if request.param == "redis":
        url = os.environ.get("REDIS_URL", "")
        if not url:
            message = "needs Redis: set REDIS_URL=redis://..."
            pytest.fail(message) if CI else pytest.skip(message)
        prefix = os.environ.get("BERTH_CHANNEL_PREFIX", "berth") + "-lease-test"
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": prefix}}}  # fmt: skip
    else:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # A renewal would come in an hour: whatever arrives sooner was woken by the commit.
    settings.BERTH_HEARTBEAT_INTERVAL = AN_HOUR
    yield request.param
    connections.close_all()


def _cluster(state: str = TaskState.PENDING) -> tuple[str, int, int, int]:
    """One node with a token and one job; its task `state` (placed on the node unless
    Pending). Returns the node token and the node, job and task ids."""
    Queue.objects.get_or_create(name="default")  # transactional tests flush the migration's
    owner = User.objects.create_user("alice")
    # Renewed a minute ago: the held lease's own renewal is then written (and seen by _held).
    node = make_node("gpu-01", gpus=1, last_heartbeat=timezone.now() - timedelta(minutes=1))
    token = node.issue_token()
    node.save()
    job = make_job(owner, gpu=1)
    if state != TaskState.PENDING:
        place(job, node, state=state, devices=1)
    return token, node.pk, job.pk, job.tasks.get().pk


def _renewed_at(node_id: int) -> Any:
    return Node.objects.get(pk=node_id).last_heartbeat


def _hold_lease(token: str, tasks: list[dict[str, Any]]) -> asyncio.Future[Any]:
    body = json.dumps({"tasks": tasks}).encode()
    headers = [(b"authorization", f"Node {token}".encode()),
               (b"berth-agent-protocol", str(PROTOCOL).encode()),
               (b"content-type", b"application/json"), (b"host", b"127.0.0.1")]  # fmt: skip
    communicator = HttpCommunicator(application, "POST", "/api/v1/agent/lease/", body, headers)
    # An hour's lease: the answer comes within this timeout only if the commit woke it.
    return asyncio.ensure_future(communicator.get_response(timeout=30))


async def _until(check: Callable[[], Any]) -> None:
    for _ in range(400):
        if await sync_to_async(check)():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("timed out")


async def _held(node_id: int, answer: asyncio.Future[Any]) -> None:
    """Wait until the lease was renewed (so it is subscribed and found no orders)."""
    before = await sync_to_async(_renewed_at)(node_id)
    await _until(lambda: _renewed_at(node_id) != before)
    await asyncio.sleep(0.05)
    assert not answer.done(), "the lease answered before there was anything to say"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_assignment_reaches_the_lease_that_was_already_waiting(layer):
    token, node_id, _, task_id = await sync_to_async(_cluster)()
    answer = _hold_lease(token, [])
    await _held(node_id, answer)
    report = await sync_to_async(run_scheduler_cycle)()  # the scheduler places the job, commits
    await sync_to_async(connections.close_all)()
    assert report.counts["placed"] == 1
    response = await answer
    assert response["status"] == 200
    orders = json.loads(response["body"])
    assert [s["id"] for s in orders["start"]] == [task_id] and orders["kill"] == []
    assert orders["start"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_cancel_reaches_the_lease_of_the_node_running_the_job(layer):
    token, node_id, job_id, task_id = await sync_to_async(_cluster)(TaskState.RUNNING)
    answer = _hold_lease(token, [{"id": task_id, "attempt": 0, "state": "Running"}])
    await _held(node_id, answer)
    await sync_to_async(
        Job.objects.filter(pk=job_id).update)(requested_action=JobRequest.CANCEL)  # fmt: skip
    await sync_to_async(run_scheduler_cycle)()
    await sync_to_async(connections.close_all)()
    response = await answer
    orders = json.loads(response["body"])
    assert [(k["id"], k["attempt"]) for k in orders["kill"]] == [(task_id, 0)]
    assert orders["start"] == []


def test_it_refuses_a_heartbeat_timeout_shorter_than_a_held_lease():
    env = {**os.environ, "BERTH_HEARTBEAT_INTERVAL": "10", "BERTH_HEARTBEAT_TIMEOUT": "12"}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0
    assert "BERTH_HEARTBEAT_TIMEOUT (12) must be longer than a held lease" in result.stderr
