"""In a real browser: pages update live as the scheduler and agents change things.

A daphne server runs as its own process on the PostgreSQL test database; this test process
plays the scheduler (run_scheduler_cycle, reconcile_flows) and an agent (the protocol over HTTP),
and publishes through Redis, as the real processes do. Screenshots go to the folder
`BERTH_SCREENSHOTS` names (`./run screenshots` sets it to docs/screenshots/), else to a folder
under the system's temporary directory: the test suite never rewrites a tracked file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from bench.processes import free_port, start_daphne
from scheduler.agent.client import PROTOCOL
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs.submit import create_flow
from scheduler.models import Flow, JobTemplate, Queue
from tests.e2e.conftest import database_url, skip_unless_shared_stack

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(
    os.environ.get("BERTH_SCREENSHOTS") or Path(tempfile.gettempdir()) / "berth-screenshots"
)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
JOIN = "browser-join"


@pytest.fixture
def server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    skip_unless_shared_stack(
        "the browser's server and this test share the database",
        "pushes go from this process to the server's",
    )
    Queue.objects.get_or_create(name="default")
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "BERTH_JOIN_TOKEN": JOIN,
        "BERTH_DATA_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("BERTH_TEST_DB_NAME", None)
    proc = start_daphne(port, env, tmp_path / "daphne.log")
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post(url: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": auth,
                                              "Berth-Agent-Protocol": str(PROTOCOL)})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


class FakeAgent:
    """An agent speaking the protocol to the live server: it reports the full state of the
    tasks it runs in every report, as the real agent does."""

    def __init__(self, url: str) -> None:
        self.url = url
        answer = _post(f"{url}/api/v1/agent/register/",
                       {"name": "gpu-01", "cpu": "8", "memory": "32Gi",
                        "labels": {"gpu-model": "a100", "zone": "lab"},
                        "devices": [{"index": 0}, {"index": 1}]}, f"Bearer {JOIN}")  # fmt: skip
        self.token = answer["token"]
        self.running: dict[int, int] = {}  # task id -> attempt
        self.offsets: dict[int, int] = {}

    def beat(self, finished: dict[int, int] | None = None) -> list[int]:
        """One heartbeat; `finished` maps task id -> exit code. Starts what the server sends
        and returns those task ids (reported Running from the next beat on)."""
        reports = [{"id": t, "attempt": a, "state": "Running"} for t, a in self.running.items()
                   if t not in (finished or {})]  # fmt: skip
        for task, code in (finished or {}).items():
            reports.append(
                {
                    "id": task,
                    "attempt": self.running.pop(task),
                    "state": "Succeeded" if code == 0 else "Failed",
                    "exit_code": code,
                    "output_bytes": self.offsets.get(task, 0),
                }
            )
        answer = _post(f"{self.url}/api/v1/agent/report/", {"tasks": reports},
                       f"Node {self.token}")  # fmt: skip
        started = [int(s["id"]) for s in answer["start"]]
        self.running.update({int(s["id"]): int(s.get("attempt", 0)) for s in answer["start"]})
        return started

    def log(self, task_id: int, text: str) -> None:
        offset = self.offsets.get(task_id, 0)
        _post(f"{self.url}/api/v1/agent/tasks/{task_id}/log/",
              {"attempt": self.running.get(task_id, 0), "offset": offset, "data": text},
              f"Node {self.token}")  # fmt: skip
        self.offsets[task_id] = offset + len(text.encode())


def test_pages_follow_jobs_and_flows_live(server: str) -> None:
    alice = User.objects.create_user("alice", password="alice-pass-123")
    bob = User.objects.create_user("bob", password="bob-pass-123")
    User.objects.create_user("admin", password="admin-pass-123", is_staff=True)
    Queue.objects.get_or_create(name="research", defaults={"weight": 2})
    JobTemplate.objects.create(
        name="step",
        spec={
            "tasks": [{"name": "main", "command": "x", "resources": {"cpu": 1, "memory": "1Gi"}}]
        },
    )
    JobTemplate.objects.create(name="train", description="one GPU", spec={"tasks": [
        {"name": "main", "command": "python train.py",
         "resources": {"cpu": 2, "memory": "4Gi", "gpu": 1}}]})  # fmt: skip
    bobs = create_flow(bob, {"name": "private", "steps": [{"name": "a", "template": "step"}]})
    agent = FakeAgent(server)
    SHOTS.mkdir(parents=True, exist_ok=True)
    asyncio.run(_scenario(server, agent, alice, bobs))


async def _sign_in(page: Any, url: str, username: str, password: str) -> None:
    from playwright.async_api import expect

    await page.goto(f"{url}/accounts/login/")
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password]", password)
    await page.click("form.card button[type=submit]")
    await expect(page.locator("#cluster-summary")).to_be_visible()


async def _scenario(url: str, agent: FakeAgent, alice: User, bobs: Flow) -> None:
    from playwright.async_api import async_playwright, expect

    def sync(fn: Any, *args: Any) -> Any:
        return asyncio.to_thread(_in_thread, fn, *args)

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await page.goto(f"{url}/jobs/")
        assert "/accounts/login/" in page.url  # every page needs a sign-in
        await page.screenshot(path=str(SHOTS / "login.png"))
        await _sign_in(page, url, "alice", "alice-pass-123")

        # Form errors show inline, naming the field; nothing is created.
        await page.goto(f"{url}/submit/")
        await page.fill("#spec", "name: bad\ntasks:\n- command: 'true'\n  resources: {gpu: 1.5}\n")
        await page.click("#submit-form button[type=submit]")
        await expect(page.locator("#form-errors")).to_contain_text("tasks.0.resources.gpu")
        assert page.url.endswith("/submit/")
        await page.screenshot(path=str(SHOTS / "submit-errors.png"))

        # The template picker prefills the editor.
        await page.select_option("select[name=template]", "train")
        await expect(page.locator("#spec")).to_have_value(re.compile("python train.py"))
        await page.screenshot(path=str(SHOTS / "submit.png"))

        # Submit a job and watch it run without reloading.
        await page.fill("#spec", "name: live\ntasks:\n- name: main\n  command: echo hi\n"
                                 "  resources: {cpu: 1, gpu: 1}\n")  # fmt: skip
        await page.click("#submit-form button[type=submit]")
        await page.wait_for_url("**/jobs/*/")
        job_id = int(page.url.rstrip("/").split("/")[-1])
        status = page.locator(f"#job-{job_id}-status .badge.big")
        await expect(status).to_have_text("Pending")
        marker = await page.evaluate("() => (window.__loaded = performance.timeOrigin)")
        await sync(run_scheduler_cycle)  # the scheduler places it
        (task_id,) = await sync(agent.beat)
        await sync(agent.beat)  # the agent reports it running
        await sync(run_scheduler_cycle)  # the lifecycle sees it run
        await expect(status).to_have_text("Running", timeout=10000)
        await expect(page.locator(f"#task-{task_id}")).to_contain_text("gpu-01")
        await sync(agent.log, task_id, "hello from the task\n")
        await sync(agent.log, task_id, "epoch 1 loss 0.25\n")
        log = page.locator(f"#job-{job_id}-log-{task_id}")
        await expect(log).to_contain_text("hello from the task\nepoch 1 loss 0.25")
        await sync(agent.beat, {task_id: 0})
        await sync(run_scheduler_cycle)
        await expect(status).to_have_text("Succeeded", timeout=10000)
        assert await page.evaluate("() => window.__loaded") == marker  # never reloaded
        await page.screenshot(path=str(SHOTS / "job.png"), full_page=True)

        # A flow's DAG recolours and its jobs' output appears as they run.
        flow = await sync(_start_flow, alice)
        await page.goto(f"{url}/flows/{flow}/")
        prep = page.locator('g[data-step="prep"]')
        train = page.locator('g[data-step="train"]')
        await expect(prep).to_have_attribute("data-state", "Pending")
        await sync(run_scheduler_cycle)  # the flow controller makes the prep job
        await expect(prep).to_have_attribute("data-state", "Running", timeout=10000)
        await sync(run_scheduler_cycle)  # the scheduler places it
        (prep_task,) = await sync(agent.beat)
        await sync(agent.beat)
        await sync(agent.log, prep_task, "downloading data\n")
        flow_log = page.locator(f"#flow-{flow}-log")
        await expect(flow_log).to_contain_text("sweep-prep/main-0  downloading data")
        await sync(agent.beat, {prep_task: 0})
        await sync(run_scheduler_cycle)
        await expect(prep).to_have_attribute("data-state", "Succeeded", timeout=10000)
        await expect(train).to_have_attribute("data-state", "Running", timeout=10000)
        await sync(run_scheduler_cycle)  # two of three train jobs start (parallelism 2)
        train_tasks = await sync(agent.beat)
        assert len(train_tasks) == 2
        await sync(agent.beat)
        await sync(run_scheduler_cycle)
        await expect(train.locator(".seg.j-running")).to_have_count(2, timeout=10000)
        await expect(train).to_contain_text("2 running")
        for i, task in enumerate(train_tasks):
            await sync(agent.log, task, f"lr sweep item {i}: epoch 1\n")
        await expect(flow_log).to_contain_text("lr sweep item 1: epoch 1")
        await page.screenshot(path=str(SHOTS / "flow.png"), full_page=True)

        # The cluster follows the GPUs live: both held, one per running train job.
        await page.goto(f"{url}/")
        await expect(page.locator(".gpu.busy")).to_have_count(2)
        await page.screenshot(path=str(SHOTS / "cluster.png"))
        await sync(agent.beat, {train_tasks[0]: 0})
        await sync(run_scheduler_cycle)  # the job ends, which frees a parallelism slot
        await sync(run_scheduler_cycle)  # the third item is placed on the freed GPU
        await expect(page.locator(".gpu.busy")).to_have_count(2, timeout=10000)
        await sync(agent.beat, {train_tasks[1]: 1})
        await sync(run_scheduler_cycle)
        await expect(page.locator(".gpu.busy")).to_have_count(1, timeout=10000)

        await page.goto(f"{url}/jobs/")
        await expect(page.locator("#jobs-table")).to_contain_text("sweep-train-1")
        await page.screenshot(path=str(SHOTS / "jobs.png"))
        await page.goto(f"{url}/flows/")
        await expect(page.locator("table.list")).to_contain_text("sweep")
        await page.screenshot(path=str(SHOTS / "flows.png"))
        await page.goto(f"{url}/queues/")
        await expect(page.locator("#queues-table")).to_contain_text("research")
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
        assert not [e for e in errors if "oob" in e.lower() or "htmx" in e.lower()], errors

        # Staff cordon a node from the nodes page; its card changes in place.
        staff = await browser.new_page(viewport={"width": 1280, "height": 800})
        await _sign_in(staff, url, "admin", "admin-pass-123")
        await staff.goto(f"{url}/nodes/")
        card = staff.locator(".node-card").first
        await expect(card).to_have_class(re.compile("state-ready"))
        await staff.click("button[aria-label='cordon gpu-01']")
        await expect(card).to_have_class(re.compile("state-cordoned"))
        await staff.screenshot(path=str(SHOTS / "nodes.png"))
        await staff.click("button[aria-label='uncordon gpu-01']")
        await expect(card).to_have_class(re.compile("state-ready"))
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
        {"name": "train", "template": "train", "depends_on": ["prep"],
         "items": [{"LR": "0.1"}, {"LR": "0.01"}, {"LR": "0.001"}]},
        {"name": "eval", "template": "step", "depends_on": ["train"]},
    ]}).pk  # fmt: skip
