"""In a real browser: a flow page says why each waiting step waits, and its graph's nodes
open their jobs. The server, scheduler and agent are those of test_live_pages."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import User

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import Job
from tests.browser.test_live_pages import (  # noqa: F401 (server is a fixture)
    CHROMIUM_ARGS,
    FakeAgent,
    _in_thread,
    _sign_in,
    server,
)

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
GPU = {"tasks": [{"name": "main", "command": "x", "resources": {"cpu": 1, "gpu": 1}}]}


def test_a_flow_page_says_why_each_step_waits(server: str) -> None:  # noqa: F811
    alice = User.objects.create_user("alice", password="alice-pass-123")
    agent = FakeAgent(server)  # one node, two GPUs
    # Another job of alice's holds both GPUs, so the flow's first job waits for resources.
    blocker = submit_job(alice, {"name": "blocker", "tasks": [
        {"name": "main", "command": "x", "resources": {"cpu": 1, "gpu": 2}}]})  # fmt: skip
    run_scheduler_cycle()  # placed
    agent.beat()
    agent.beat()  # reported running
    run_scheduler_cycle()
    flow = create_flow(alice, {"name": "why", "parallelism": 1, "steps": [
        {"name": "first", "spec": GPU},
        {"name": "second", "spec": GPU},
        {"name": "after", "spec": GPU, "depends_on": ["first", "second"]},
    ]})  # fmt: skip
    assert Job.objects.get(pk=blocker.pk).state == "Running"
    asyncio.run(_scenario(server, flow.pk))


async def _scenario(url: str, flow_id: int) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await _sign_in(page, url, "alice", "alice-pass-123")
        await page.goto(f"{url}/flows/{flow_id}/")
        after = page.locator('[data-waiting="after"]')
        await expect(after).to_have_text("waits: waiting for steps first, second to succeed")

        # The controller makes the two first jobs; parallelism 1 holds one. Pushed live.
        await asyncio.to_thread(_in_thread, run_scheduler_cycle)
        held = page.locator('[data-waiting="second"]')
        slot = "waiting for a parallelism slot (1/1 active in flow why)"
        await expect(held).to_contain_text(slot, timeout=10000)
        # The scheduler finds no free GPU for the released one: the page names the job's reason.
        await asyncio.to_thread(_in_thread, run_scheduler_cycle)
        first_job, reason = await asyncio.to_thread(_in_thread, _first_job, flow_id)
        assert reason, "the scheduler gave the waiting job a pending reason"
        await page.reload()
        await expect(page.locator('[data-waiting="first"]')).to_have_text(
            f"waits: job {first_job}: {reason}"
        )

        # The graph's node opens the step's job.
        await page.locator('g[data-step="first"]').click()
        await page.wait_for_url(f"**/jobs/{first_job}/")

        # A failed flow's Retry button runs its failed steps again.
        await asyncio.to_thread(_in_thread, _fail_flow, flow_id)
        await page.goto(f"{url}/flows/{flow_id}/")
        badge = page.locator(f"#flow-{flow_id}-status .badge.big")
        await expect(badge).to_have_text("Failed")
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.get_by_role("button", name="Retry failed steps").click()
        await expect(badge).to_have_text("Running", timeout=10000)
        await expect(page.locator('[data-waiting="after"]')).to_have_text(
            "waits: waiting for steps first, second to succeed"
        )
        await browser.close()


def _first_job(flow_id: int) -> tuple[int, str]:
    job = Job.objects.get(flow_id=flow_id, step__name="first")
    return job.pk, job.pending_message


def _fail_flow(flow_id: int) -> None:
    """The flow's jobs fail (as agents would report) and the controller ends the flow."""
    from django.utils import timezone

    from scheduler.flows.controller import reconcile_flows

    Job.objects.filter(flow_id=flow_id).update(state="Failed", finished_at=timezone.now())
    reconcile_flows()
