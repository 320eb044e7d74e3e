"""In a real browser: the usage page draws its GPU-hours chart with the vendored uPlot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.browser.test_live_pages import (
    CHROMIUM_ARGS,
    SHOTS,
    _sign_in,
    server,  # noqa: F401 - the live server fixture
)
from tests.factories import make_usage

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_the_usage_chart_renders(server: str) -> None:  # noqa: F811
    User.objects.create_user("admin", password="admin-pass-123", is_staff=True)
    alice = User.objects.create_user("alice", password="alice-pass-123")
    bob = User.objects.create_user("bob", password="bob-pass-123")
    for day, hours in enumerate([4.0, 6.5, 2.0, 8.0, 5.0]):
        make_usage(
            alice, gpu_seconds=hours * 3600, days_ago=day + 1, job_id=10 + day, task_id=10 + day
        )
        make_usage(
            bob, gpu_seconds=hours / 2 * 3600, days_ago=day + 2, job_id=20 + day, task_id=20 + day
        )
    asyncio.run(_look(server))


async def _look(url: str) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page: Any = await browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await _sign_in(page, url, "admin", "admin-pass-123")
        await page.goto(f"{url}/usage/")
        chart = page.locator("#usage-chart .uplot canvas")
        await expect(chart).to_be_visible()
        box = await chart.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 200
        legend = page.locator("#usage-chart .u-legend .u-series .u-label")
        await expect(legend).to_have_text(["Time", "alice", "bob"])
        # Something was drawn: the canvas is not blank.
        painted = await page.evaluate(
            """() => { const c = document.querySelector('#usage-chart canvas');
                       const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                       let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
                       return n; }"""
        )
        assert painted > 1000
        assert errors == []
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / "usage.png"))
        await browser.close()
