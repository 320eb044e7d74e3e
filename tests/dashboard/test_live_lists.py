"""The jobs and flows lists are live: a new job or flow is pushed as a row the page inserts on
top (data-live-insert), to its owner's list and staff's only; a pending job's status too."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from berth.asgi import application
from dashboard import live
from scheduler.models import Flow, Job, Queue

ORIGIN = (b"origin", b"http://127.0.0.1")
pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _headers(user: User) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def _users() -> tuple[User, User, User]:
    Queue.objects.get_or_create(name="default")
    return (
        User.objects.create_user("alice"),
        User.objects.create_user("bob"),
        User.objects.create_user("root", is_staff=True),
    )


async def _open(path: str, user: User) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(
        application, path, headers=await database_sync_to_async(_headers)(user)
    )
    assert (await socket.connect(timeout=10))[0]
    return socket


def _new_job(owner: User) -> Job:
    return Job.objects.create(
        name="fresh", owner=owner, queue=Queue.objects.get(), spec={},
        pending_code="NeverFits", pending_message="0/2 nodes fit: 2 insufficient gpu",
    )  # fmt: skip


async def test_a_new_job_and_flow_reach_their_owners_and_staffs_lists_only():
    alice, bob, root = await database_sync_to_async(_users)()
    sockets = {
        (who.username, kind): await _open(f"/ws/{kind}/", who)
        for who in (alice, bob, root)
        for kind in ("jobs", "flows")
    }
    job = await database_sync_to_async(_new_job)(alice)
    flow = await database_sync_to_async(Flow.objects.create)(name="sweep", owner=alice, spec={})
    await database_sync_to_async(live.publish)(jobs={job.pk}, flows={flow.pk})
    for who in ("alice", "root"):
        row = await sockets[(who, "jobs")].receive_from(timeout=5)
        assert f'id="job-row-{job.pk}"' in row and 'data-live-insert="#jobs-table > tbody"' in row
        assert "never fits" in row and "0/2 nodes fit" in row
        row = await sockets[(who, "flows")].receive_from(timeout=5)
        assert f'id="flow-row-{flow.pk}"' in row and "flows-table" in row
    for kind in ("jobs", "flows"):
        assert await sockets[("bob", kind)].receive_nothing(timeout=0.3)
    for socket in sockets.values():
        await socket.disconnect()
    await sync_to_async(connections.close_all)()
