"""In a real browser: the node page and the job page draw GPU utilisation and memory charts
(vendored uPlot) and add the samples an agent sends afterwards without a reload."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Device, DeviceSample, Job, Task
from tests.browser.test_live_pages import (
    CHROMIUM_ARGS,
    SHOTS,
    FakeAgent,
    _post,
    _sign_in,
    server,  # noqa: F401 - the live server fixture
)
from tests.factories import make_job

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
GI = 2**30
PAINTED = """(selector) => { const c = document.querySelector(selector);
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""


def _history(job: Job) -> None:
    """Forty minutes of samples every 30 s: GPU 0 busy for the job's last ten, GPU 1 idle."""
    now = timezone.now()
    Task.objects.filter(job=job).update(started_at=now - timedelta(minutes=10))
    rows = []
    for device in Device.objects.filter(node__name="gpu-01"):
        for step in range(80):
            when = now - timedelta(seconds=30 * (80 - step))
            busy = device.index == 0 and when > now - timedelta(minutes=10)
            rows.append(DeviceSample(device=device, time=when, utilization=90 if busy else 3,
                                     memory_used=(12 if busy else 1) * GI))  # fmt: skip
    DeviceSample.objects.bulk_create(rows)


def test_node_and_job_pages_chart_gpu_utilisation_live(server: str) -> None:  # noqa: F811
    User.objects.create_user("alice", password="alice-pass-123")
    alice = User.objects.get(username="alice")
    agent = FakeAgent(server)  # registers gpu-01 with GPUs 0 and 1
    job = make_job(alice, "train", gpu=1)
    run_scheduler_cycle()  # bound to GPU 0
    assert agent.beat() == [job.tasks.get().pk]
    agent.beat()  # now Running
    run_scheduler_cycle()
    _history(job)
    asyncio.run(_look(server, agent, job.pk))


def _lease_with_samples(url: str, token: str) -> None:
    """What an agent's lease renewal carries: GPU 0 at 77 %."""
    gpus = [{"index": 0, "utilization": 77, "memory_used": 14 * GI, "memory_total": 16 * GI},
            {"index": 1, "utilization": 0, "memory_used": 0, "memory_total": 16 * GI}]  # fmt: skip
    _post(f"{url}/api/v1/agent/lease/", {"tasks": [], "wait": 0, "usage": {"gpus": gpus}},
          f"Node {token}")  # fmt: skip


async def _drawn(page: Any) -> None:
    """Both charts are drawn, laid out by uPlot's stylesheet (legend below the plot)."""
    from playwright.async_api import expect

    for chart in (".gpu-util", ".gpu-mem"):
        canvas = page.locator(f"{chart} .uplot canvas")
        await expect(canvas).to_be_visible()
        box = await canvas.bounding_box()
        legend = await page.locator(f"{chart} .u-legend").bounding_box()
        assert box and legend and box["width"] > 300 and box["height"] > 150
        assert legend["y"] >= box["y"] + box["height"] - 1
        assert await page.evaluate(PAINTED, f"{chart} canvas") > 1000


async def _look(url: str, agent: FakeAgent, job_id: int) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page: Any = await browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await _sign_in(page, url, "alice", "alice-pass-123")

        # The node card links to the node's page, which charts both GPUs over the last hour.
        await page.click("#node-grid a[href='/nodes/gpu-01/'], a[href='/nodes/gpu-01/']")
        legend = page.locator(".gpu-util .u-legend .u-series .u-label")
        await expect(legend).to_have_text(["Time", "gpu-01 GPU 0", "gpu-01 GPU 1"])
        await _drawn(page)
        holder = page.locator("[data-gpu-chart]")
        await expect(holder).to_have_attribute("data-points", "80")
        await page.screenshot(path=str(SHOTS / "node-gpus.png"))

        # An agent's next lease renewal reaches the open chart without a reload.
        await asyncio.to_thread(_lease_with_samples, url, agent.token)
        await expect(holder).to_have_attribute("data-points", "81", timeout=20_000)

        # The job page charts the GPU the job holds, over the job's life only: its last ten
        # minutes (19 samples after its start) and the lease's sample.
        await page.goto(f"{url}/jobs/{job_id}/")
        await expect(page.locator(".gpu-util .u-legend .u-series .u-label")).to_have_text(
            ["Time", "gpu-01 GPU 0"]
        )
        await expect(page.locator("[data-gpu-chart]")).to_have_attribute("data-points", "20")
        await _drawn(page)
        await page.screenshot(path=str(SHOTS / "job-gpus.png"))
        assert errors == []
        await browser.close()
