"""A task attempt's whole output over REST (`GET /api/v1/jobs/{job}/tasks/{task}/log/`):
streamed as text/plain, per attempt, the owner's (and staff's) only."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient

from scheduler.models import Task, TaskLog
from tests.factories import make_job

pytestmark = pytest.mark.django_db
CHUNK = 60 * 1024  # what an agent ships at most per request


def url(task: Task, **params: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"/api/v1/jobs/{task.job_id}/tasks/{task.pk}/log/" + (f"?{query}" if query else "")


def store(task: Task, attempt: int, text: str, chunk: int = CHUNK) -> None:
    """Store `text` as an agent would ship it: chunks placed by byte offset."""
    data = text.encode()
    TaskLog.objects.bulk_create(
        TaskLog(task=task, attempt=attempt, offset=at, data=data[at : at + chunk].decode())
        for at in range(0, len(data), chunk)
    )


@pytest.fixture
def retried(owner) -> Task:
    """A task on its second attempt, with the first attempt's output kept."""
    task = make_job(owner).tasks.get()
    Task.objects.filter(pk=task.pk).update(attempt=1)
    store(task, 0, "first try\nit failed\n")
    store(task, 1, "second try\n")
    task.refresh_from_db()
    return task


def body(response) -> str:
    assert response.streaming, "the log is streamed, not built in memory"
    return b"".join(response.streaming_content).decode()


def test_the_owner_downloads_the_latest_attempt_as_text(api, owner, retried):
    response = api(owner).get(url(retried))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert f"job-{retried.job_id}-main-0-attempt-1.log" in response["Content-Disposition"]
    assert body(response) == "second try\n"


def test_an_earlier_attempt_is_there_too(api, owner, retried):
    assert body(api(owner).get(url(retried, attempt=0))) == "first try\nit failed\n"


@pytest.mark.parametrize(("who", "status"), [("teammate", 404), ("outsider", 404),
                                             ("staff", 200)])  # fmt: skip
def test_only_its_owner_and_staff_see_it(request, api, retried, who, status):
    response = api(request.getfixturevalue(who)).get(url(retried, attempt=0))
    assert response.status_code == status
    if status == 404:
        assert "first try" not in response.content.decode()


def test_anonymous_callers_are_refused(api, retried):
    assert api(None).get(url(retried)).status_code in (401, 403)


def test_a_task_of_another_job_is_404(api, owner, retried):
    other = make_job(owner, "other")
    response = api(owner).get(f"/api/v1/jobs/{other.pk}/tasks/{retried.pk}/log/")
    assert response.status_code == 404


@pytest.mark.parametrize(("query", "field"), [
    ("attempt=2", "attempt"), ("attempt=x", "attempt"), ("attempt=-1", "attempt"),
    ("tail=5", "tail")])  # fmt: skip
def test_a_bad_or_unknown_parameter_is_400_naming_it(api, owner, retried, query, field):
    response = api(owner).get(url(retried) + f"?{query}")
    assert response.status_code == 400
    assert field in response.json()


def test_errors_come_as_text_to_a_client_that_asks_for_text(api, owner, retried, outsider):
    bad = api(owner).get(url(retried, attempt=9), HTTP_ACCEPT="text/plain")
    assert bad.status_code == 400 and bad["Content-Type"].startswith("text/plain")
    expected = "attempt: must be a whole number from 0 to 1 (this task's latest)\n"
    assert bad.content.decode() == expected
    missing = api(outsider).get(url(retried), HTTP_ACCEPT="text/plain")
    assert missing.status_code == 404 and missing.content.decode().endswith("\n")


def test_a_log_far_larger_than_the_pages_tail_comes_whole(api, owner):
    task = make_job(owner).tasks.get()
    lines = "".join(f"line {i:06d} ✓\n" for i in range(40_000))  # ~560 kB, 10 chunks
    store(task, 0, lines)
    response = api(owner).get(url(task))
    pieces = list(response.streaming_content)
    assert b"".join(pieces).decode() == lines
    assert len(pieces) >= 10  # sent as it is read, chunk by chunk


def test_output_an_agent_re_sent_from_an_earlier_offset_is_not_repeated(api, owner):
    task = make_job(owner).tasks.get()
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="abcdef")
    TaskLog.objects.create(task=task, attempt=0, offset=4, data="efgh")  # overlaps "ef"
    TaskLog.objects.create(task=task, attempt=0, offset=8, data="ij")
    assert body(api(owner).get(url(task))) == "abcdefghij"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_under_asgi_it_streams_the_same_bytes_asynchronously(owner, retried):
    client = AsyncClient()
    await client.aforce_login(owner)
    response: Any = await client.get(url(retried, attempt=0))
    assert response.status_code == 200 and response.is_async
    pieces = [piece async for piece in response.streaming_content]
    # The test client keeps connections open after a request; the reads' thread has one.
    await sync_to_async(connections.close_all)()
    assert b"".join(pieces).decode() == "first try\nit failed\n"
