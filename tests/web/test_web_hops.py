"""What one HTTP request costs the web worker beyond its view: the middleware chain and the
view run in one thread hop (berth/web/handler.py), and the Redis cache keeps one client per
process instead of one per request (berth/web/cache.py)."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from asgiref.sync import SyncToAsync, sync_to_async
from channels.testing import HttpCommunicator
from django.core.cache import caches
from django.db import connections
from rest_framework.authtoken.models import Token

from berth.asgi import application


@pytest_asyncio.fixture
async def _close_connections():
    """Rows written by the async ORM and the handler's threads: let go of their connections
    so that the test database can be dropped."""
    yield
    await sync_to_async(connections.close_all)()


SPEC = {"name": "hop", "tasks": [{"name": "main", "command": "true"}]}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_close_connections")
async def test_a_submission_through_the_asgi_app_takes_two_thread_hops(monkeypatch):
    from django.contrib.auth.models import User

    from scheduler.models import Queue

    await Queue.objects.aget_or_create(name="default")  # a flushed database has none
    user = await User.objects.acreate(username="hops")
    token = await Token.objects.acreate(user=user)
    calls: list[str] = []
    real_call = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await real_call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    body = json.dumps(SPEC).encode()
    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1"),
               (b"authorization", f"Token {token.key}".encode()),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    response = await HttpCommunicator(
        application, "POST", "/api/v1/jobs/", body=body, headers=headers
    ).get_response(timeout=10)
    monkeypatch.undo()
    assert response["status"] == 201, response["body"]
    # request_started's receivers, then the whole chain and the view (closing the response,
    # request_finished, may come after the answer). Django's async chain took 15 here: each
    # sync middleware's process_request and process_response on its own.
    assert len(calls) <= 3, calls


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_close_connections")
async def test_static_files_are_still_served_through_the_asgi_app():
    communicator = HttpCommunicator(
        application, "GET", "/static/berth/live.js", headers=[(b"host", b"127.0.0.1")]
    )
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=10)
    body = b""
    while True:  # a file is streamed in chunks
        message = await communicator.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    assert start["status"] == 200
    assert b"function" in body or len(body) > 100


def test_every_cache_object_of_a_process_shares_one_redis_client(settings):
    if "Redis" not in settings.CACHES["default"]["BACKEND"]:
        pytest.skip("no REDIS_URL: the in-memory cache")
    # Under ASGI each request has a context of its own, and so a cache object of its own.
    first, second = caches.create_connection("default"), caches.create_connection("default")
    assert first is not second
    assert first._cache is second._cache  # type: ignore[attr-defined]
