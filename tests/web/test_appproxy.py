"""The app proxy's answers when it does not reach an app (berth/web/appproxy.py): 404 for what is
not yours (whether it exists or not), 502 naming the job when the app is not running or does
not answer, 401 for a bad token, 413 past the body bound. In process, through the ASGI app
as served (berth/asgi.py); tests/e2e/test_e2e_apps.py has the app answering."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connections
from rest_framework.authtoken.models import Token

from bench.processes import free_port
from berth.asgi import application
from scheduler.models import Job, Node, Queue, Task

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _setup(owner: Any, outsider: Any) -> dict[str, Any]:
    queue = Queue.objects.get_or_create(name="default")[0]
    node = Node.objects.create(name="n", cpu=1000, memory=2**30, address="127.0.0.1")

    def job(state: str, apps: Any, port: int | None, who: Any = owner) -> int:
        spec = {"apps": apps, "tasks": []} if apps else {"tasks": []}
        row = Job.objects.create(name="j", owner=who, queue=queue, spec=spec, state=state)
        Task.objects.create(job=row, group="main", index=0, node=node, app_port=port,
                            state="Running" if state == "Running" else "Pending")  # fmt: skip
        return row.pk

    closed = free_port()  # nothing listens there
    return {
        "token": Token.objects.create(user=owner).key,
        "theirs": Token.objects.create(user=outsider).key,
        "pending": job("Pending", [{"kind": "http"}], None),
        "silent": job("Running", [{"kind": "jupyter"}], closed),
        "plain": job("Running", None, None),
    }


async def _get(path: str, token: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        headers = {"Authorization": f"Token {token}"}
        return await client.request(kwargs.pop("method", "GET"), path, headers=headers, **kwargs)


async def test_what_the_proxy_answers_without_an_app(owner, outsider, settings):
    jobs = await database_sync_to_async(_setup)(owner, outsider)
    token = jobs["token"]
    pending = await _get(f"/apps/{jobs['pending']}/", token)
    assert pending.status_code == 502 and f"job {jobs['pending']} is not running" in pending.text
    silent = await _get(f"/apps/{jobs['silent']}/lab", token)
    assert silent.status_code == 502
    assert f"the app of job {jobs['silent']} does not answer (ConnectError)" in silent.text
    for path in (
        f"/apps/{jobs['plain']}/",
        f"/apps/{jobs['plain'] + 999}/",
        "/apps/x/",
        f"/apps/0{jobs['pending']}/",
        "/apps/99999999999999999999999/",
    ):
        assert (await _get(path, token)).status_code == 404, path
    for job in ("pending", "silent"):  # another user: the same 404 as for no job at all
        assert (await _get(f"/apps/{jobs[job]}/", jobs["theirs"])).status_code == 404
    assert (await _get(f"/apps/{jobs['pending']}/", "bad-token")).status_code == 401
    moved = await _get(f"/apps/{jobs['silent']}", token)
    assert moved.status_code == 301 and moved.headers["location"] == f"/apps/{jobs['silent']}/"
    settings.BERTH_APP_MAX_BODY_BYTES = 1024
    big = await _get(f"/apps/{jobs['silent']}/x", token, method="POST", content=b"x" * 2048)
    assert big.status_code == 413
    await sync_to_async(connections.close_all)()


async def test_what_the_user_does_through_the_proxy_is_the_apps_use(owner, outsider, monkeypatch):
    """Use keeps an interactive GPU job from being ended as idle
    (scheduler/lifecycle/idle_sessions.py): a request that changes something (a notebook
    saved) or a message on one of the app's websockets (a cell run, a key in its terminal),
    written at most every USE_MARK_SECONDS. Reads are not use: an open tab polls by itself."""
    import asyncio

    from berth.web import appproxy
    from scheduler.jobs import webapps

    jobs = await database_sync_to_async(_setup)(owner, outsider)
    silent, token = jobs["silent"], jobs["token"]
    monkeypatch.setattr(webapps, "_marked", {})

    def used() -> Any:
        return Job.objects.get(pk=silent).app_used_at

    def forget() -> None:
        Job.objects.filter(pk=silent).update(app_used_at=None)

    await _get(f"/apps/{silent}/api/kernels", token)  # a poll
    assert await database_sync_to_async(used)() is None
    await _get(f"/apps/{silent}/api/contents/a.ipynb", token, method="PUT", content=b"{}")
    assert await database_sync_to_async(used)() is not None
    await database_sync_to_async(forget)()
    await _get(f"/apps/{silent}/api/contents/a.ipynb", token, method="PUT", content=b"{}")
    assert await database_sync_to_async(used)() is None  # written again only 30 s later

    class Upstream:  # the app: takes what it is sent, says nothing
        close_code = 1000
        sent: list[Any] = []

        async def send(self, data: Any) -> None:
            self.sent.append(data)

        def __aiter__(self) -> Upstream:
            return self

        async def __anext__(self) -> Any:
            await asyncio.sleep(3600)

    messages = [{"type": "websocket.receive", "text": "run cell"}, {"type": "websocket.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    monkeypatch.setattr(webapps, "_marked", {})
    upstream = Upstream()
    await appproxy.relay(receive, send, upstream, silent)  # type: ignore[arg-type]
    assert upstream.sent == ["run cell"]
    assert await database_sync_to_async(used)() is not None
    await sync_to_async(connections.close_all)()


async def test_a_use_that_cannot_be_written_fails_no_request(owner, outsider, monkeypatch):
    """The database down while the user saves a notebook: the request is proxied all the
    same (here to an app that does not answer: the 502 naming the job), never a 500."""
    from django.db import OperationalError

    from berth.web import appproxy
    from scheduler.jobs import webapps

    jobs = await database_sync_to_async(_setup)(owner, outsider)
    monkeypatch.setattr(webapps, "_marked", {})

    def down(job_id: int) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(appproxy, "mark_app_used", down)
    saved = await _get(f"/apps/{jobs['silent']}/api/contents/a.ipynb", jobs["token"],
                       method="PUT", content=b"{}")  # fmt: skip
    assert saved.status_code == 502 and "does not answer" in saved.text
    await sync_to_async(connections.close_all)()
