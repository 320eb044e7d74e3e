"""The job page's terminal in a real browser (docs/interactive.md): xterm.js attached to a
session in the running job's task, through daphne, the channel layer and a real agent."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from scheduler.models import Event, Job
from scheduler.states.names import JobState
from tests.browser.test_live_pages import CHROMIUM_ARGS, _sign_in
from tests.cli.test_shell_live import shell_cluster as shell_cluster  # noqa: F401 - a fixture
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.e2e]
BERTH = str(Path(sys.executable).with_name("berth"))


def test_the_owner_types_in_the_job_pages_terminal_and_reads_the_echo(
    shell_cluster: Cluster,  # noqa: F811
) -> None:
    alice = User.objects.create_user("alice", password="alice-pass-123")
    User.objects.create_user("carol", password="carol-pass-123")
    env = {**os.environ, "BERTH_URL": shell_cluster.url,
           "BERTH_TOKEN": Token.objects.create(user=alice).key}  # fmt: skip
    out = subprocess.run([BERTH, "submit", "--cpu", "0.1", "--mem", "64Mi", "--", "sleep",
                          "300"], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    job_id = int(out.stdout.split()[-1])
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, what="job to run")
    try:
        asyncio.run(_scenario(shell_cluster.url, job_id))
    except AssertionError as exc:  # where the session stopped: its rows and the processes' logs
        raise AssertionError(f"{exc}\n{_story(shell_cluster, job_id)}") from None
    wait_for(lambda: Event.objects.filter(job_id=job_id, kind="ShellClosed").exists(),
             what="the session's close on the record")  # fmt: skip
    assert Event.objects.filter(job_id=job_id, kind="ShellOpened").count() == 1


def _story(cluster: Cluster, job_id: int) -> str:
    """The job, its sessions and the ends of the cluster's logs, for a failure's message."""
    from scheduler.models import ShellSession

    fields = ("key", "state", "reason", "exit_status", "opened_at", "closed_at", "last_input_at")
    sessions = list(ShellSession.objects.filter(job_id=job_id).values(*fields))
    events = list(Event.objects.filter(job_id=job_id).values_list("kind", "message"))
    logs = []
    for path in sorted(cluster.tmp.glob("*.log")):
        text = path.read_bytes().decode(errors="replace")
        logs.append(f"--- {path.name} (end) ---\n{text[-3000:]}")
    return "\n".join([f"job: {Job.objects.get(pk=job_id).state}", f"sessions: {sessions}",
                      f"events: {events}", *logs])  # fmt: skip


def _tell_terminals(job_id: int, message: str) -> None:
    """What the server does to warn a job's open terminals (scheduler/notify.py), from here:
    the test shares the cluster's database and Redis."""
    from django.db import connection

    from scheduler import notify
    from scheduler.models import ShellSession

    try:
        channels = ShellSession.objects.filter(job_id=job_id, state=ShellSession.State.OPEN)
        notify.terminal_notice(list(channels.values_list("client_channel", flat=True)), message)
    finally:
        connection.close()


async def _scenario(url: str, job_id: int) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await _sign_in(page, url, "carol", "carol-pass-123")
        await page.goto(f"{url}/jobs/{job_id}/")  # not hers: no such page, no terminal
        assert await page.locator("#terminal-open").count() == 0
        await page.context.clear_cookies()
        await _sign_in(page, url, "alice", "alice-pass-123")
        await page.goto(f"{url}/jobs/{job_id}/")
        await page.click("#terminal-open")
        await expect(page.locator("#terminal-status")).to_have_text("connected", timeout=30000)
        await page.keyboard.type("echo typed-$((6 * 7)) $BERTH_JOB_ID\n")
        rows: Any = page.locator("#terminal .xterm-rows")
        await expect(rows).to_contain_text(f"typed-42 {job_id}", timeout=30000)
        # A line from Berth between the session's output (an idle warning, say), in yellow.
        notice = f"Berth: job {job_id} (sleep): its GPUs have been below 1 % for 60 min"
        await asyncio.to_thread(_tell_terminals, job_id, notice)
        await expect(rows).to_contain_text(f"[{notice}]", timeout=30000)
        await expect(page.locator("#terminal-status")).to_have_text(notice)
        yellow = rows.locator("span[class*='xterm-fg-']", has_text="its GPUs have been below")
        assert await yellow.count() >= 1
        await page.keyboard.type("exit 5\n")
        await expect(page.locator("#terminal-status")).to_have_text("ended: exit status 5",
                                                                    timeout=30000)  # fmt: skip
        await browser.close()
