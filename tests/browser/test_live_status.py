"""In a real browser: lists take new jobs and flows live, a waiting job's status is pushed as
it changes (up to "never fits" when the cluster shrinks), and a dropped socket shows a banner
and the page catches up once the server is back.

A daphne server runs as its own process on the PostgreSQL test database (restarted once, on
the same port, to drop the sockets); this test process plays the scheduler and publishes
through Redis, as the real processes do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from bench.processes import free_port, start_daphne
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import JobTemplate, Node, Queue
from tests.browser.test_live_pages import CHROMIUM_ARGS, _in_thread, _sign_in
from tests.e2e.conftest import database_url, skip_unless_shared_stack
from tests.factories import make_node

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]
WIDE = "name: wide\ntasks:\n- name: main\n  command: 'true'\n  resources: {cpu: 1, gpu: 2}\n"


class Daphne:
    """The web server as its own process, which the test can stop and start again."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1",
                    "BERTH_DATA_DIR": str(tmp_path)}  # fmt: skip
        self.env.pop("BERTH_TEST_DB_NAME", None)
        self.log_path = tmp_path / "daphne.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_daphne(self.port, self.env, self.log_path, append=True)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def daphne(transactional_db: None, tmp_path: Path) -> Iterator[Daphne]:
    skip_unless_shared_stack(
        "the browser's server and this test share the database",
        "pushes go from this process to the server's",
    )
    server = Daphne(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_lists_and_statuses_are_live_and_catch_up_after_a_drop(daphne: Daphne) -> None:
    alice = User.objects.create_user("alice", password="alice-pass-123")
    Queue.objects.get_or_create(name="default")
    make_node("gpu-big", gpus=2)
    JobTemplate.objects.create(name="step", spec={"tasks": [{"name": "main", "command": "x"}]})
    asyncio.run(_scenario(daphne, alice))


def _sync(fn: Any, *args: Any) -> Any:
    return asyncio.to_thread(_in_thread, fn, *args)


def _set_queue_open(is_open: bool) -> None:
    Queue.objects.filter(name="default").update(open=is_open)


def _shrink_cluster() -> None:
    """The 2-GPU node leaves; a 1-GPU node is all that remains."""
    Node.objects.filter(name="gpu-big").delete()
    make_node("gpu-small", gpus=1)


async def _scenario(server: Daphne, alice: User) -> None:
    from playwright.async_api import async_playwright, expect

    url = server.url
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        jobs = await context.new_page()
        await _sign_in(jobs, url, "alice", "alice-pass-123")
        await jobs.goto(f"{url}/jobs/")
        await jobs.evaluate("() => (window.__marker = 1)")
        flows = await context.new_page()
        await flows.goto(f"{url}/flows/")

        # Another tab submits a job: it appears on the list without a reload.
        other = await context.new_page()
        await other.goto(f"{url}/submit/")
        await other.fill("#spec", WIDE)
        await other.click("#submit-form button[type=submit]")
        await other.wait_for_url("**/jobs/*/")
        job_id = int(other.url.rstrip("/").split("/")[-1])
        row = jobs.locator(f"#job-row-{job_id}")
        await expect(row).to_contain_text("wide", timeout=10000)
        assert await jobs.evaluate("() => window.__marker") == 1  # never reloaded

        # A new flow appears on the flows list.
        flow = await _sync(lambda: create_flow(alice, {"name": "sweep", "steps": [
            {"name": "a", "template": "step"}]}).pk)  # fmt: skip
        await expect(flows.locator(f"#flow-row-{flow}")).to_contain_text("sweep", timeout=10000)

        # The job's status is pushed to its page and its row as it changes.
        waiting = other.locator(f"#job-{job_id}-status .waiting")
        await _sync(_set_queue_open, False)
        await _sync(run_scheduler_cycle)
        await expect(waiting).to_contain_text("QueueClosed", timeout=10000)
        await expect(row).to_contain_text("QueueClosed", timeout=10000)
        await _sync(_shrink_cluster)
        await _sync(_set_queue_open, True)
        await _sync(run_scheduler_cycle)
        await expect(waiting.locator(".badge.never-fits")).to_be_visible(timeout=10000)
        await expect(waiting).to_contain_text("0/1 nodes fit: 1 insufficient gpu")
        await expect(row.locator(".badge.never-fits")).to_be_visible(timeout=10000)

        # The server goes away: the banner says so; a job submitted meanwhile is on the list
        # once the page has caught up with the server back.
        await _sync(server.stop)
        await expect(jobs.locator("#ws-lost")).to_be_visible(timeout=10000)
        late = await _sync(lambda: submit_job(alice, {"name": "late", "tasks": [
            {"name": "main", "command": "true"}]}).pk)  # fmt: skip
        await _sync(server.start)
        await expect(jobs.locator("#ws-lost")).to_be_hidden(timeout=30000)
        await expect(jobs.locator(f"#job-row-{late}")).to_contain_text("late", timeout=10000)
        assert await jobs.evaluate("() => window.__marker") == 1
        # And the socket is live again.
        later = await _sync(lambda: submit_job(alice, {"name": "later", "tasks": [
            {"name": "main", "command": "true"}]}).pk)  # fmt: skip
        await expect(jobs.locator(f"#job-row-{later}")).to_contain_text("later", timeout=10000)

        # A close the ws extension does not retry by itself (1001: the server going away
        # cleanly): the page fetches its live area anew, which opens a fresh socket.
        await jobs.evaluate("""() => document.querySelector('[ws-connect]').dispatchEvent(
            new CustomEvent('htmx:wsClose', {bubbles: true, detail: {event: {code: 1001}}}))""")
        await expect(jobs.locator("#ws-lost")).to_be_hidden(timeout=30000)
        last = await _sync(lambda: submit_job(alice, {"name": "last", "tasks": [
            {"name": "main", "command": "true"}]}).pk)  # fmt: skip
        await expect(jobs.locator(f"#job-row-{last}")).to_contain_text("last", timeout=10000)
        assert await jobs.evaluate("() => window.__marker") == 1
        await browser.close()
