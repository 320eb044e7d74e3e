"""The README's first command: `manage.py up` alone runs a job for real and the page follows it.

Embedded defaults: SQLite, the in-memory channel layer, the scheduler loop and a local agent
in the same process as the web server. Nothing is faked: the local agent runs the command.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.processes import free_port, wait_until_serving

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def test_up_runs_a_job_and_the_page_follows_it_live(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "BERTH_SECRET_KEY", "BERTH_TEST_DB_NAME",
                        "DJANGO_SETTINGS_MODULE")}  # fmt: skip
    env.update({"BERTH_DATA_DIR": str(tmp_path), "BERTH_SCHEDULER_INTERVAL": "0.3",
                "BERTH_HEARTBEAT_INTERVAL": "0.3", "BERTH_HEARTBEAT_TIMEOUT": "30"})  # fmt: skip
    # (30 s, not 4.25 x 0.3: a stall of the loaded CI machine must not lose the node's task)
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port), "--fake-gpus", "1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, tmp_path / "up.log", timeout=60)
        password = (tmp_path / "admin_password").read_text().strip()
        # Its output is a file: it printed where the password is kept, not the password.
        printed = (tmp_path / "up.log").read_text()
        assert password not in printed and str(tmp_path / "admin_password") in printed
        asyncio.run(_watch_a_job(url, password))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()


async def _watch_a_job(url: str, password: str) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = await browser.new_page()
        await page.goto(f"{url}/accounts/login/")
        await page.fill("input[name=username]", "admin")
        await page.fill("input[name=password]", password)
        await page.click("form.card button[type=submit]")
        await expect(page.locator(".node-card")).to_have_count(1, timeout=15000)
        await page.goto(f"{url}/submit/")
        await page.fill("#spec", "name: embedded\ntasks:\n- name: main\n"
                                 "  command: 'echo ran on GPU $CUDA_VISIBLE_DEVICES; sleep 5'\n"
                                 "  resources: {cpu: 0.1, memory: 16Mi, gpu: 1}\n")  # fmt: skip
        await page.click("#submit-form button[type=submit]")
        await page.wait_for_url("**/jobs/*/")
        badge = page.locator(".head .badge.big")
        # No reload from here on: every change arrives over the websocket. The job runs 5 s: on
        # a loaded machine the report of its start can be held back (SQLite busy: 503 and
        # Retry-After) past a shorter run, and the page would rightly go straight to the end.
        await expect(badge).to_have_text("Running", timeout=20000)
        await expect(page.locator("pre.log")).to_contain_text("ran on GPU 0", timeout=20000)
        await expect(badge).to_have_text("Succeeded", timeout=20000)
        await browser.close()
