"""Websockets: login and ownership on connect; each page gets only its own object's updates."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from berth.asgi import application
from dashboard.live import publish
from scheduler.models import Flow

ORIGIN = (b"origin", b"http://127.0.0.1")
pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _cookie_for(user: User | None) -> list[tuple[bytes, bytes]]:
    if user is None:
        return [ORIGIN]
    client = Client()
    client.force_login(user)
    return [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def _setup() -> tuple[User, User, Flow, Flow]:
    owner = User.objects.create_user("alice")
    outsider = User.objects.create_user("carol")
    a = Flow.objects.create(name="a", owner=owner, spec={})
    b = Flow.objects.create(name="b", owner=owner, spec={})
    return owner, outsider, a, b


async def _connect(path: str, user: User | None) -> tuple[WebsocketCommunicator, bool]:
    headers = await database_sync_to_async(_cookie_for)(user)
    socket = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await socket.connect(timeout=10)
    return socket, connected


async def test_a_flow_socket_gets_its_own_updates_and_never_another_flows():
    owner, _, a, b = await database_sync_to_async(_setup)()
    sock_a, ok_a = await _connect(f"/ws/flows/{a.pk}/", owner)
    sock_b, ok_b = await _connect(f"/ws/flows/{b.pk}/", owner)
    assert ok_a and ok_b
    await database_sync_to_async(publish)(flows=[a.pk])
    html = await sock_a.receive_from(timeout=5)
    assert f'id="flow-{a.pk}-status"' in html and f"flow-{b.pk}" not in html
    assert await sock_b.receive_nothing(timeout=0.5)
    await sock_a.disconnect()
    await sock_b.disconnect()
    await sync_to_async(connections.close_all)()


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
async def test_other_users_and_anonymous_sockets_are_refused(who):
    owner, outsider, a, _ = await database_sync_to_async(_setup)()
    user = outsider if who == "outsider" else None
    for path in (f"/ws/flows/{a.pk}/", "/ws/cluster/" if who == "anonymous" else None):
        if path is None:
            continue
        socket, connected = await _connect(path, user)
        assert not connected
        await socket.disconnect()
    await sync_to_async(connections.close_all)()


async def test_a_jobs_list_socket_gets_only_its_users_rows():
    from scheduler.models import Job, Queue

    def make() -> tuple[User, User, int, int]:
        owner, outsider, _, _ = _setup()
        queue = Queue.objects.get_or_create(name="default")[0]
        mine = Job.objects.create(name="mine", owner=owner, queue=queue, spec={})
        theirs = Job.objects.create(name="theirs", owner=outsider, queue=queue, spec={})
        return owner, outsider, mine.pk, theirs.pk

    owner, _, mine, theirs = await database_sync_to_async(make)()
    socket, connected = await _connect("/ws/jobs/", owner)
    assert connected
    await database_sync_to_async(publish)(jobs=[theirs])
    assert await socket.receive_nothing(timeout=0.5)
    await database_sync_to_async(publish)(jobs=[mine])
    assert f'id="job-row-{mine}"' in await socket.receive_from(timeout=5)
    await socket.disconnect()
    await sync_to_async(connections.close_all)()


async def test_a_job_socket_is_for_its_owner_and_staff_only():
    from scheduler.models import Job, Queue

    def make() -> tuple[User, User, User, int]:
        owner, outsider, _, _ = _setup()
        staff = User.objects.create_user("admin", is_staff=True)
        queue = Queue.objects.get_or_create(name="default")[0]
        return (
            owner,
            outsider,
            staff,
            Job.objects.create(name="j", owner=owner, queue=queue, spec={}).pk,
        )

    owner, outsider, staff, job = await database_sync_to_async(make)()
    for user, allowed in ((owner, True), (staff, True), (outsider, False), (None, False)):
        socket, connected = await _connect(f"/ws/jobs/{job}/", user)
        assert connected == allowed, user
        await socket.disconnect()
    socket, connected = await _connect(f"/ws/jobs/{job + 1000}/", staff)
    assert not connected  # no such job: refused even for staff
    await socket.disconnect()
    await sync_to_async(connections.close_all)()
