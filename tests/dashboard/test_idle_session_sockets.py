"""An idle GPU session's warning in its terminal (scheduler/lifecycle/idle_sessions.py,
docs/interactive.md#idle-gpu-sessions): the user's socket gets a `notice` when the job is
warned, a key typed through the relay reaches the agent and is recorded as the session's
input, and the next check withdraws the warning, saying so in the terminal."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from scheduler.lifecycle import idle_sessions
from scheduler.models import Event, Job, ShellSession, Task, hash_token
from tests.dashboard.test_shell_sockets import _agent, _close, _open, _user, _wait_session
from tests.factories import make_job, make_node, place

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _setup() -> dict[str, Any]:
    alice = User.objects.create_user("alice")
    node = make_node("node-a", gpus=1, token_hash=hash_token("token-of-node-a"))
    job = make_job(alice, "shell", gpu=1, command="exec sleep infinity")
    job.spec = {**job.spec, "interactive": {"persist": False}}
    job.save(update_fields=["spec"])
    place(job, node, devices=1)
    return {"job": job.pk, "key": Token.objects.create(user=alice).key}


def _idle_for_two_hours(job_id: int) -> None:
    """Its GPUs idle and its session quiet since two hours ago (as leases and the relay
    would have written it)."""
    then = timezone.now() - timedelta(hours=2)
    Task.objects.filter(job_id=job_id).update(gpu_idle_since=then, started_at=then)
    Job.objects.filter(pk=job_id).update(started_at=then)
    ShellSession.objects.filter(job_id=job_id).update(opened_at=then, created_at=then)


def _idle_events(job_id: int) -> list[tuple[str, str]]:
    rows = Event.objects.filter(job_id=job_id, kind__startswith="SessionIdle").order_by("pk")
    return list(rows.values_list("kind", "reason"))


async def _notice(socket: Any) -> str:
    message = json.loads(await socket.receive_from(timeout=5))
    assert message["type"] == "notice", message
    return str(message["message"])


async def test_the_terminal_is_warned_and_a_key_typed_withdraws_the_warning():
    rows = await database_sync_to_async(_setup)()
    user, ok, _ = await _user(rows["job"], rows["key"])
    assert ok
    key = await _open(user, rows["job"])
    agent, ok, _ = await _agent(key, "token-of-node-a")
    assert ok
    assert json.loads(await user.receive_from(timeout=5))["type"] == "ready"
    await _wait_session(rows["job"], "Open")
    await database_sync_to_async(_idle_for_two_hours)(rows["job"])

    assert await database_sync_to_async(idle_sessions.check_sessions)() == 1
    warning = await _notice(user)
    assert f"job {rows['job']}" in warning and "will be ended at" in warning
    assert await database_sync_to_async(idle_sessions.check_sessions)() == 0  # once

    await user.send_to(bytes_data=b"\r")
    assert await agent.receive_from(timeout=5) == b"\r"
    for _ in range(250):  # the relay records the input after passing it on
        session = await database_sync_to_async(ShellSession.objects.get)(key=key)
        if session.last_input_at is not None:
            break
        await asyncio.sleep(0.02)
    assert session.last_input_at is not None
    assert await database_sync_to_async(idle_sessions.check_sessions)() == 1
    assert "will not be ended" in await _notice(user)
    assert await database_sync_to_async(_idle_events)(rows["job"]) == [
        ("SessionIdleWarning", "GpusIdle"), ("SessionIdleCleared", "TerminalInput")
    ]  # fmt: skip
    job = await database_sync_to_async(Job.objects.get)(pk=rows["job"])
    assert job.state == "Running" and job.idle_ends_at is None
    await _close(user, agent)
