"""In a real browser: the job page's output pane picks a task's attempt, follows the latest one
live (an earlier attempt's pane stays still), and its download link gives the whole output."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import User

from dashboard.live import publish
from scheduler.models import Node, Task, TaskLog
from scheduler.states.names import TaskState
from tests.browser.test_live_pages import CHROMIUM_ARGS, FakeAgent, _in_thread, _sign_in
from tests.browser.test_live_pages import server as server  # noqa: F401 - a fixture
from tests.factories import make_job, place

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_the_attempt_picker_and_the_live_pane(server: str) -> None:  # noqa: F811
    alice = User.objects.create_user("alice", password="alice-pass-123")
    agent = FakeAgent(server)
    job = make_job(alice, "retried")
    place(job, Node.objects.get(name="gpu-01"), state=TaskState.RUNNING)
    task = job.tasks.get()
    Task.objects.filter(pk=task.pk).update(attempt=1)
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="first try\nit failed\n")
    agent.running[task.pk] = 1
    agent.log(task.pk, "second try\n")
    asyncio.run(_scenario(server, agent, job.pk, task.pk))


async def _scenario(url: str, agent: FakeAgent, job_id: int, task_id: int) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await _sign_in(page, url, "alice", "alice-pass-123")
        await page.goto(f"{url}/jobs/{job_id}/")
        live = page.locator(f"#job-{job_id}-log-{task_id}")
        await expect(live).to_have_text("second try\n")
        picker = page.locator(f"#task-{task_id}-output select[name=attempt]")

        await picker.select_option("0")  # an earlier attempt: shown, not followed
        earlier = page.locator(f"#job-{job_id}-log-{task_id}-attempt-0")
        await expect(earlier).to_have_text("first try\nit failed\n")
        await expect(live).to_have_count(0)
        link = page.locator(f"#task-{task_id}-output a.download")
        download = await page.request.get(url + (await link.get_attribute("href") or ""))
        assert await download.text() == "first try\nit failed\n"
        await asyncio.to_thread(_in_thread, agent.log, task_id, "while you looked away\n")

        await picker.select_option("1")  # back to the latest: it follows live again
        await expect(live).to_have_text("second try\nwhile you looked away\n")
        await asyncio.to_thread(_in_thread, agent.log, task_id, "epoch 2\n")
        await expect(live).to_have_text("second try\nwhile you looked away\nepoch 2\n")
        await expect(earlier).to_have_count(0)

        # A retry: the pushed tasks table names attempt 2, and the pane moves on to it.
        await asyncio.to_thread(_in_thread, _retry, job_id, task_id)
        await expect(picker).to_have_value("2")
        await expect(live).to_have_text("third try\n")
        await browser.close()


def _retry(job_id: int, task_id: int) -> None:
    Task.objects.filter(pk=task_id).update(attempt=2)
    TaskLog.objects.create(task_id=task_id, attempt=2, offset=0, data="third try\n")
    publish(jobs=[job_id])  # what the scheduler's commit does
