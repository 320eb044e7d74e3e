"""In a real browser: pages update live as the scheduler and agents change things.

A daphne server runs as its own process on the PostgreSQL test database; this test process
plays the scheduler (run_cycle_once, reconcile_flows) and an agent (the protocol over HTTP),
and publishes through Redis, as the real processes do. Screenshots go to docs/screenshots/.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import connection

from scheduler.flows.controller import reconcile_flows
from scheduler.loop import run_cycle_once
from scheduler.models import Flow, Job, JobTemplate, Queue
from scheduler.submit import create_flow

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
JOIN = "browser-join"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the browser's server and this test share the database")
    if "channels_redis" not in str(django_settings.CHANNEL_LAYERS["default"]["BACKEND"]):
        pytest.skip("needs Redis (REDIS_URL): pushes go from this process to the server's")
    Queue.objects.get_or_create(name="default")
    db = connection.settings_dict
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",  # noqa: E501
        "BERTH_JOIN_TOKEN": JOIN,
        "BERTH_DATA_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("BERTH_TEST_DB_NAME", None)
    log = open(tmp_path / "daphne.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "berth.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/accounts/login/", timeout=1)
            break
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError((tmp_path / "daphne.log").read_text()) from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _post(url: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": auth})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


class FakeAgent:
    """An agent speaking the protocol to the live server, one step at a time."""

    def __init__(self, url: str) -> None:
        self.url = url
        answer = _post(f"{url}/api/v1/agent/register/",
                       {"name": "gpu-01", "cpu": "8", "memory": "32Gi",
                        "devices": [{"index": 0}, {"index": 1}]}, f"Bearer {JOIN}")  # fmt: skip
        self.token = answer["token"]

    def beat(self, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        return _post(f"{self.url}/api/v1/agent/heartbeat/", {"tasks": tasks}, f"Node {self.token}")

    def log(self, task_id: int, text: str) -> None:
        _post(f"{self.url}/api/v1/agent/tasks/{task_id}/log/",
              {"attempt": 0, "offset": 0, "data": text}, f"Node {self.token}")  # fmt: skip


def test_pages_follow_jobs_and_flows_live(server: str) -> None:
    alice = User.objects.create_user("alice", password="alice-pass-123")
    bob = User.objects.create_user("bob", password="bob-pass-123")
    JobTemplate.objects.create(name="step", spec={"tasks": [{"name": "main", "command": "x"}]})
    bobs = create_flow(bob, {"name": "private", "steps": [{"name": "a", "template": "step"}]})
    agent = FakeAgent(server)
    SHOTS.mkdir(parents=True, exist_ok=True)
    asyncio.run(_scenario(server, agent, alice, bobs))


async def _scenario(url: str, agent: FakeAgent, alice: User, bobs: Flow) -> None:
    from playwright.async_api import async_playwright, expect

    def sync(fn: Any, *args: Any) -> Any:
        return asyncio.to_thread(_in_thread, fn, *args)

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 860})
        await page.goto(f"{url}/accounts/login/")
        await page.fill("input[name=username]", "alice")
        await page.fill("input[name=password]", "alice-pass-123")
        await page.click("form.card button[type=submit]")
        await expect(page.locator(".summary")).to_be_visible()

        # Form errors show inline, naming the field.
        await page.goto(f"{url}/submit/")
        await page.fill("#spec", "name: bad\ntasks:\n- command: 'true'\n  resources: {gpu: 1.5}\n")
        await page.click("#submit-form button[type=submit]")
        await expect(page.locator("#form-errors")).to_contain_text("tasks.0.resources.gpu")
        await page.screenshot(path=str(SHOTS / "submit-errors.png"))

        # Submit a job and watch it run without reloading.
        await page.fill("#spec", "name: live\ntasks:\n- name: main\n  command: echo hi\n"
                                 "  resources: {cpu: 1, gpu: 1}\n")  # fmt: skip
        await page.click("#submit-form button[type=submit]")
        await page.wait_for_url("**/jobs/*/")
        job_id = int(page.url.rstrip("/").split("/")[-1])
        status = page.locator(f"#job-{job_id}-status .badge.big")
        await expect(status).to_have_text("Pending")
        await sync(run_cycle_once)  # the scheduler places it
        start = (await sync(agent.beat, []))["start"]
        task_id = start[0]["id"]
        await sync(agent.beat, [{"id": task_id, "attempt": 0, "state": "Running"}])
        await sync(run_cycle_once)  # the lifecycle sees it run
        await expect(status).to_have_text("Running", timeout=10000)
        await sync(agent.log, task_id, "hello from the task\n")
        await expect(page.locator(f"#log-{task_id}")).to_contain_text("hello from the task")
        await page.goto(f"{url}/")
        await expect(page.locator(".gpu.busy")).to_have_count(1)
        await page.screenshot(path=str(SHOTS / "cluster.png"))
        await page.goto(f"{url}/jobs/{job_id}/")
        await sync(agent.beat, [{"id": task_id, "attempt": 0, "state": "Succeeded",
                                 "exit_code": 0}])  # fmt: skip
        await sync(run_cycle_once)
        await expect(page.locator(f"#job-{job_id}-status .badge.big")).to_have_text(
            "Succeeded", timeout=10000
        )
        await page.screenshot(path=str(SHOTS / "job.png"), full_page=True)

        # A flow's DAG recolours as its steps run.
        flow = await sync(_start_flow, alice)
        await page.goto(f"{url}/flows/{flow}/")
        prep = page.locator('g[data-step="prep"]')
        await expect(prep).to_have_attribute("data-state", "Pending")
        await sync(reconcile_flows)
        await expect(prep).to_have_attribute("data-state", "Running", timeout=10000)
        await sync(_finish_step, flow, "prep")
        await expect(prep).to_have_attribute("data-state", "Succeeded", timeout=10000)
        await expect(page.locator('g[data-step="train"]')).to_have_attribute(
            "data-state", "Running", timeout=10000
        )
        await page.screenshot(path=str(SHOTS / "flow.png"), full_page=True)
        await page.goto(f"{url}/jobs/")
        await page.screenshot(path=str(SHOTS / "jobs.png"))
        await page.goto(f"{url}/nodes/")
        await page.screenshot(path=str(SHOTS / "nodes.png"))
        await page.goto(f"{url}/flows/")
        await expect(page.locator("table.list")).to_contain_text("sweep")
        await page.screenshot(path=str(SHOTS / "flows.png"))
        await page.goto(f"{url}/queues/")
        await expect(page.locator("table.list")).to_contain_text("default")
        await page.screenshot(path=str(SHOTS / "queues.png"))

        # Another user's flow: the page is 404 and its socket is refused.
        response = await page.goto(f"{url}/flows/{bobs.pk}/")
        assert response is not None and response.status == 404
        outcome = await page.evaluate(
            """(path) => new Promise((resolve) => {
                const ws = new WebSocket(`ws://${location.host}${path}`);
                ws.onopen = () => resolve("opened");
                ws.onclose = () => resolve("refused");
            })""",
            f"/ws/flows/{bobs.pk}/",
        )
        assert outcome == "refused"
        await browser.close()


def _in_thread(fn: Any, *args: Any) -> Any:
    from django.db import connections

    try:
        return fn(*args)
    finally:
        connections.close_all()


def _start_flow(alice: User) -> int:
    return create_flow(alice, {"name": "sweep", "parallelism": 2, "steps": [
        {"name": "prep", "template": "step"},
        {"name": "train", "template": "step", "depends_on": ["prep"],
         "items": [{"LR": "0.1"}, {"LR": "0.01"}, {"LR": "0.001"}]},
    ]}).pk  # fmt: skip


def _finish_step(flow_id: int, step: str) -> None:
    from django.utils import timezone

    Job.objects.filter(flow_id=flow_id, step__name=step).update(
        state="Succeeded", finished_at=timezone.now()
    )
    reconcile_flows()
    reconcile_flows()
