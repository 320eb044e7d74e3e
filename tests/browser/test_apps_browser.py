"""In a real browser, against a real cluster (daphne as `manage.py up` serves Berth, the
scheduler loop and an agent as processes): a job's web app opens from its page ("Open")
through the proxy, the page counts the job's time down, and the opt-in job alerts show a
browser notification when the owner's job starts and when it ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.authtoken.models import Token

from bench.processes import free_port, start_daphne
from scheduler.models import Job
from scheduler.states.names import JobState
from tests.browser.test_live_pages import CHROMIUM_ARGS, _sign_in
from tests.e2e.conftest import Cluster, wait_for
from tests.e2e.test_e2e_apps import HTTP_APP

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.e2e]

# Every Notification the page makes, recorded (the browser's own still shows it).
RECORD_NOTIFICATIONS = """
(() => {
  const Real = window.Notification;
  window.__notes = [];
  class Recorded extends Real {
    constructor(title, options) { super(title, options); window.__notes.push(title); }
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...a) => Real.requestPermission(...a);
  window.Notification = Recorded;
})();
"""


@pytest.fixture
def on_daphne(cluster: Cluster, tmp_path: Path) -> Iterator[Cluster]:
    port = free_port()
    server = start_daphne(port, cluster.env, tmp_path / "daphne.log")  # not a group leader
    cluster.url = f"http://127.0.0.1:{port}"
    try:
        yield cluster
    finally:
        cluster.stop()
        server.terminate()
        server.wait(timeout=10)


def _submit(url: str, key: str, spec: dict[str, Any]) -> int:
    response = httpx.post(f"{url}/api/v1/jobs/", json=spec,
                          headers={"Authorization": f"Token {key}"})  # fmt: skip
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _job(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields, "tasks": [{"name": "main", "command": command,
            "resources": {"cpu": "0.1", "memory": "64Mi"}}]}  # fmt: skip


def test_an_app_opens_from_its_page_and_job_alerts_notify(on_daphne: Cluster, owner: Any) -> None:
    owner.set_password("alice-pass-123")
    owner.save()
    key = Token.objects.create(user=owner).key
    on_daphne.agent("browser-app")
    on_daphne.scheduler()
    app = _submit(on_daphne.url, key, _job("site", HTTP_APP, apps="http", walltime=3600))
    wait_for(lambda: Job.objects.get(pk=app).state == JobState.RUNNING, timeout=60,
             what="the app's job to run")  # fmt: skip
    asyncio.run(_scenario(on_daphne.url, key, app))


async def _scenario(url: str, key: str, app: int) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        await context.grant_permissions(["notifications"], origin=url)
        await context.add_init_script(RECORD_NOTIFICATIONS)
        page = await context.new_page()
        await _sign_in(page, url, "alice", "alice-pass-123")

        await page.goto(f"{url}/jobs/{app}/")
        remaining = page.locator(f"#job-{app}-remaining")
        await expect(remaining).to_have_text(re.compile(r"^5\dm \d\ds$"))  # of 60m
        first = await remaining.text_content()
        await expect(remaining).not_to_have_text(first or "")  # it ticks
        await expect(page.locator(".app-open")).to_be_visible(timeout=60_000)
        async with context.expect_page() as opened:
            await page.click(".app-open")
        tab = await opened.value
        await expect(tab.locator("h1")).to_have_text("Directory listing for /")
        assert tab.url == f"{url}/apps/{app}/"
        await tab.close()

        await page.click("#job-alerts")
        await expect(page.locator("#job-alerts")).to_have_text("Job alerts: on")
        await page.wait_for_timeout(500)  # its socket joins before the job is submitted
        short = await asyncio.to_thread(_submit, url, key, _job("short", "sleep 2"))
        await page.wait_for_function(
            f"window.__notes.includes('Job {short} started')"
            f" && window.__notes.includes('Job {short} succeeded')",
            timeout=60_000,
        )
        await browser.close()
