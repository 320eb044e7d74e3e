"""dashboard.live: what each group receives, rendered only when somebody watches it."""

from __future__ import annotations

from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client, override_settings

from berth.asgi import application
from dashboard import live
from scheduler.models import Flow, Job, Queue, Task

ORIGIN = (b"origin", b"http://127.0.0.1")


def _headers(user: User) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def _setup() -> tuple[list[tuple[bytes, bytes]], Job, Job, Task, Task, Flow]:
    owner = User.objects.create_user("alice")
    queue = Queue.objects.get_or_create(name="default")[0]
    flow = Flow.objects.create(name="sweep", owner=owner, spec={})
    a = Job.objects.create(name="sweep-a", owner=owner, queue=queue, spec={}, flow=flow)
    b = Job.objects.create(name="other", owner=owner, queue=queue, spec={})
    ta = Task.objects.create(job=a, group="main", index=0)
    tb = Task.objects.create(job=b, group="main", index=0)
    return _headers(owner), a, b, ta, tb, flow


async def _open(path: str, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await socket.connect(timeout=10)
    assert connected
    return socket


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_log_lines_reach_their_job_and_flow_pages_only():
    headers, a, b, ta, _, flow = await database_sync_to_async(_setup)()
    job_a = await _open(f"/ws/jobs/{a.pk}/", headers)
    job_b = await _open(f"/ws/jobs/{b.pk}/", headers)
    flow_socket = await _open(f"/ws/flows/{flow.pk}/", headers)

    await database_sync_to_async(live.publish_log)(ta.pk, 0, 0, "epoch 1 <ok>\nepoch 2")
    html = await job_a.receive_from(timeout=5)
    assert f'hx-swap-oob="beforeend:#job-{a.pk}-log-{ta.pk}"' in html
    assert "epoch 1 &lt;ok&gt;\nepoch 2" in html  # escaped, newlines kept
    flow_html = await flow_socket.receive_from(timeout=5)
    assert f'hx-swap-oob="beforeend:#flow-{flow.pk}-log"' in flow_html
    assert "sweep-a/main-0  epoch 1 &lt;ok&gt;\nsweep-a/main-0  epoch 2\n" in flow_html
    assert await job_b.receive_nothing(timeout=0.3)

    # A late chunk of an attempt that has been replaced shows nowhere.
    await database_sync_to_async(Task.objects.filter(pk=ta.pk).update)(attempt=1)
    await database_sync_to_async(live.publish_log)(ta.pk, 0, 100, "stale")
    assert await job_a.receive_nothing(timeout=0.3)
    for socket in (job_a, job_b, flow_socket):
        await socket.disconnect()
    await sync_to_async(connections.close_all)()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_job_change_reaches_its_page_its_flow_and_the_cluster():
    headers, a, b, _, _, flow = await database_sync_to_async(_setup)()
    job_a = await _open(f"/ws/jobs/{a.pk}/", headers)
    job_b = await _open(f"/ws/jobs/{b.pk}/", headers)
    flow_socket = await _open(f"/ws/flows/{flow.pk}/", headers)
    cluster = await _open("/ws/cluster/", headers)
    await database_sync_to_async(live.publish)(jobs={a.pk})
    html = await job_a.receive_from(timeout=5)
    assert f'id="job-{a.pk}-status"' in html and f'id="job-{a.pk}-tasks"' in html
    assert f'id="flow-{flow.pk}-dag"' in await flow_socket.receive_from(timeout=5)
    assert 'id="cluster-summary"' in await cluster.receive_from(timeout=5)
    assert await job_b.receive_nothing(timeout=0.3)
    for socket in (job_a, job_b, flow_socket, cluster):
        await socket.disconnect()
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db
@override_settings(
    CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
    CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                        "LOCATION": "nobody-watches"}},
)  # fmt: skip
def test_nothing_is_rendered_for_pages_nobody_has_open(owner):
    # In memory: a shared cache may hold the presence of sockets closed less than
    # presence.TTL ago, and then a render for "somebody" is the right thing to do.
    Queue.objects.get_or_create(name="default")
    job = Job.objects.create(name="j", owner=owner, queue=Queue.objects.get(), spec={})
    with mock.patch.object(live, "render_to_string") as render:
        live.publish(jobs={job.pk}, nodes={1})
        live.publish_log(0, 0, 0, "no such task")
    render.assert_not_called()
