"""Who watches a live group (dashboard.presence): marked by open sockets through the cache's
public API, read by publishers in one round trip."""

from __future__ import annotations

from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.cache import caches
from django.db import connections
from django.test import Client, override_settings

from berth.asgi import application
from dashboard import live, presence
from scheduler.models import Job, Queue

ORIGIN = (b"origin", b"http://127.0.0.1")
ALONE = override_settings(
    CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
    CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                        "LOCATION": "presence-tests"}},
)  # fmt: skip


def _setup() -> tuple[list[tuple[bytes, bytes]], Job, Job]:
    owner = User.objects.create_user("alice")
    queue = Queue.objects.get_or_create(name="default")[0]
    seen = Job.objects.create(name="seen", owner=owner, queue=queue, spec={})
    unseen = Job.objects.create(name="unseen", owner=owner, queue=queue, spec={})
    client = Client()
    client.force_login(owner)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    return [ORIGIN, cookie], seen, unseen


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@ALONE
async def test_an_open_page_is_watched_and_only_watched_pages_are_rendered():
    caches["default"].clear()
    headers, seen, unseen = await database_sync_to_async(_setup)()
    socket = WebsocketCommunicator(application, f"/ws/jobs/{seen.pk}/", headers=headers)
    assert (await socket.connect(timeout=10))[0]
    groups = [f"job-{seen.pk}", f"job-{unseen.pk}"]
    assert await sync_to_async(presence.watched)(groups) == {f"job-{seen.pk}"}
    with mock.patch.object(live, "render_to_string", return_value="<p>x</p>") as render:
        await database_sync_to_async(live.publish)(jobs={unseen.pk})
    render.assert_not_called()
    await database_sync_to_async(live.publish)(jobs={seen.pk})
    assert f'id="job-{seen.pk}-status"' in await socket.receive_from(timeout=5)
    await socket.disconnect()
    await sync_to_async(connections.close_all)()


def test_a_failing_cache_means_pushing_to_everyone():
    with mock.patch.object(presence.cache, "get_many", side_effect=ConnectionError("down")):
        assert presence.watched(["a", "b", "a"]) == {"a", "b"}


@pytest.mark.django_db
@ALONE
def test_with_no_live_page_open_publishing_costs_no_query(owner):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    caches["default"].clear()
    job = Job.objects.create(name="j", owner=owner, queue=Queue.objects.get_or_create(
        name="default")[0], spec={})  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        live.publish(jobs={job.pk}, flows={1}, nodes={1})
    assert len(queries) == 0
