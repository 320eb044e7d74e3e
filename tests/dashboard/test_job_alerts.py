"""Browser notifications for your own jobs (opt-in, static/berth/job-alerts.js): its socket,
/ws/me/jobs/, carries the rows of the signed-in user's own jobs only — staff included, who
see everyone's jobs elsewhere — with the state and times the script reads."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.utils import timezone

from berth.asgi import application
from dashboard.live import publish
from scheduler.models import Job, Queue

ORIGIN = (b"origin", b"http://127.0.0.1")


def _headers(user: User) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_alerts_socket_carries_only_your_own_jobs_rows():
    def make() -> tuple[list[tuple[bytes, bytes]], int, int]:
        staff = User.objects.create_user("admin", is_staff=True)
        other = User.objects.create_user("bob")
        queue = Queue.objects.get_or_create(name="default")[0]
        mine = Job.objects.create(name="mine", owner=staff, queue=queue, spec={},
                                  state="Running", started_at=timezone.now())  # fmt: skip
        theirs = Job.objects.create(name="theirs", owner=other, queue=queue, spec={})
        return _headers(staff), mine.pk, theirs.pk

    headers, mine, theirs = await database_sync_to_async(make)()
    socket = WebsocketCommunicator(application, "/ws/me/jobs/", headers=headers)
    assert (await socket.connect(timeout=10))[0]
    await database_sync_to_async(publish)(jobs=[theirs])
    assert await socket.receive_nothing(timeout=0.5)  # staff, but not their job
    await database_sync_to_async(publish)(jobs=[mine])
    row = await socket.receive_from(timeout=5)
    assert f'data-job="{mine}" data-state="Running" data-started="' in row
    await socket.disconnect()
    anonymous = WebsocketCommunicator(application, "/ws/me/jobs/", headers=[ORIGIN])
    assert not (await anonymous.connect(timeout=10))[0]
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db
def test_signed_in_pages_offer_the_opt_in_button(client, owner):
    assert b"job-alerts" not in client.get("/accounts/login/").content
    client.force_login(owner)
    page = client.get("/jobs/").content.decode()
    assert 'id="job-alerts" data-ws="/ws/me/jobs/" hidden' in page
    assert "berth/job-alerts.js" in page
