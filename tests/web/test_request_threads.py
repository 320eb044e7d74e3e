"""How a web worker schedules its requests (berth/web/handler.py, berth/web/serve.py): a fixed set
of threads taken first come, first served, 503 + Retry-After for one that waits too long, the
body read before a thread is taken, the agents' requests in a line of their own, their
leases on shared threads instead of a new one each, and the loaded objects frozen out of
the garbage collector's sight."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator

from berth import asgi
from berth.web.handler import OneHopASGIHandler, RequestThreads, SharedThreads

NOWHERE = "/no-such-page-for-this-test/"  # a 404 through the whole middleware chain
HOST = [(b"host", b"127.0.0.1")]


def _headers(start: dict[str, Any]) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in start.get("headers", [])}


async def _get(app: Any, path: str = NOWHERE) -> dict[str, Any]:
    return await HttpCommunicator(app, "GET", path, headers=HOST).get_response(timeout=10)


@pytest.mark.asyncio
async def test_requests_run_on_the_same_few_threads_not_a_new_one_each(monkeypatch):
    handler = OneHopASGIHandler(threads=2)
    names: list[str] = []
    real = OneHopASGIHandler.get_response

    def recorded(self: OneHopASGIHandler, request: Any) -> Any:
        names.append(threading.current_thread().name)
        return real(self, request)

    monkeypatch.setattr(OneHopASGIHandler, "get_response", recorded)
    for _ in range(5):
        assert (await _get(handler))["status"] == 404
    # Django's own handler made a ThreadSensitiveContext, so a new thread, per request.
    assert all(name.startswith("berth-request-") for name in names), names
    assert len(set(names)) <= 2, names


@pytest.mark.asyncio
async def test_threads_are_handed_out_in_arrival_order():
    threads = RequestThreads(1)
    first = await threads.take(1)
    assert first is not None
    order: list[int] = []

    async def wait_for_it(n: int) -> None:
        executor = await threads.take(5)
        assert executor is not None
        order.append(n)
        threads.give_back(executor)

    waiters = []
    for n in range(4):
        waiters.append(asyncio.create_task(wait_for_it(n)))
        await asyncio.sleep(0)  # each one queued before the next arrives
    assert threads.waiting == 4
    threads.give_back(first)
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2, 3]
    assert threads.waiting == 0


@pytest.mark.asyncio
async def test_a_request_that_finds_no_thread_in_time_gets_503_with_retry_after(settings):
    settings.DB_POOL_TIMEOUT = 0.05
    settings.BERTH_RETRY_AFTER_SECONDS = 3
    handler = OneHopASGIHandler(threads=1)
    held = await handler.threads.take(1)  # the only thread is busy
    response = await _get(handler)
    assert response["status"] == 503
    assert _headers(response)[b"retry-after"] == b"3"
    assert b"server busy" in response["body"]
    assert held is not None
    handler.threads.give_back(held)
    assert (await _get(handler))["status"] == 404  # and it serves again once one is free


@pytest.mark.asyncio
async def test_a_slow_upload_holds_no_thread():
    handler = OneHopASGIHandler(threads=1)
    slow = HttpCommunicator(handler, "POST", NOWHERE, headers=HOST)
    await slow.send_input({"type": "http.request", "body": b"{", "more_body": True})
    await asyncio.sleep(0.05)
    # The slow client's body is not complete: the only thread is still free for others.
    assert (await _get(handler))["status"] == 404
    assert handler.threads.waiting == 0
    await slow.send_input({"type": "http.request", "body": b"}", "more_body": False})
    assert (await slow.receive_output(timeout=10))["status"] == 404


@pytest.mark.asyncio
async def test_lease_requests_share_threads_instead_of_starting_one_each():
    names: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        names.append(await sync_to_async(lambda: threading.current_thread().name)())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    shared = SharedThreads(app, size=2)
    for _ in range(6):
        assert (await _get(shared, "/"))["status"] == 200
    assert len(set(names)) == 2 and all(n.startswith("berth-shared-") for n in names), names
    assert isinstance(asgi.lease_app, SharedThreads)  # and the agents' leases go through it


def test_a_worker_freezes_what_it_loaded(monkeypatch):
    from berth.web import serve

    calls: list[str] = []
    monkeypatch.setattr(serve.UvicornWorker, "load_wsgi", lambda self: calls.append("load"))
    monkeypatch.setattr(serve, "open_database_pool", lambda: calls.append("pool"))
    real_freeze = serve.freeze_loaded_objects
    monkeypatch.setattr(serve, "freeze_loaded_objects", lambda: calls.append("freeze"))
    serve.BerthUvicornWorker.load_wsgi(object.__new__(serve.BerthUvicornWorker))
    assert calls == ["load", "pool", "freeze"]
    try:
        real_freeze()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


@pytest.mark.asyncio
async def test_agents_and_users_wait_in_lines_of_their_own(settings):
    """Every user thread busy: an agent's report is still served; every agent thread busy:
    a user's request is still served (and each line still answers 503 when its own wait is
    too long)."""
    settings.DB_POOL_TIMEOUT = 0.2
    agent_path = "/api/v1/agent/report/"
    handler = OneHopASGIHandler(threads=1)
    user_thread = await handler.threads.take(1)
    assert user_thread is not None
    assert (await _get(handler, agent_path))["status"] == 426  # the view answered: no queue
    assert (await _get(handler))["status"] == 503  # the user line is full
    handler.threads.give_back(user_thread)
    agent_threads = [await handler.agent_threads.take(1) for _ in range(handler.agent_threads.size)]
    assert (await _get(handler))["status"] == 404  # served, not queued
    assert (await _get(handler, agent_path))["status"] == 503
    for executor in agent_threads:
        assert executor is not None
        handler.agent_threads.give_back(executor)


@pytest.mark.asyncio
async def test_an_agents_request_below_a_root_path_still_takes_the_agents_line(settings):
    settings.DB_POOL_TIMEOUT = 0.2
    handler = OneHopASGIHandler(threads=1)
    user_thread = await handler.threads.take(1)
    assert user_thread is not None
    communicator = HttpCommunicator(handler, "GET", "/berth/api/v1/agent/report/", headers=HOST)
    communicator.scope["root_path"] = "/berth"
    assert (await communicator.get_response(timeout=10))["status"] != 503  # not the user line
    handler.threads.give_back(user_thread)
