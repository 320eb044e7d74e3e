"""Live-update latency: a change committed on the scheduler side until it is in the page's DOM.

Starts daphne (its own process) on PostgreSQL and Redis and opens a job's page in headless
Chromium. This process then plays the scheduler: it commits a change to the job N times, each
published the way the loop publishes (scheduler.notify -> dashboard.live -> Redis), and the
page records when each change lands in its DOM (a MutationObserver). Prints JSON with p50/p95.

    python bench/live_latency.py --updates 200

Uses a database of its own (DATABASE_URL's server, database `berth_bench_live`), recreated
each run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BENCH_SECRET_KEY  # noqa: E402
from bench.processes import free_port, start_daphne  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=200, help="how many changes to time")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between changes")
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    if args.updates < 1:
        parser.error("--updates must be at least 1")

    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS berth_bench_live WITH (FORCE)")
        conn.execute("CREATE DATABASE berth_bench_live")
    db_url = args.database.rsplit("/", 1)[0] + "/berth_bench_live"
    data = Path(tempfile.mkdtemp(prefix="berth-live-"))
    env = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": args.redis,
           "BERTH_SECRET_KEY": BENCH_SECRET_KEY, "BERTH_DATA_DIR": str(data),
           "BERTH_CHANNEL_PREFIX": "berth-live-bench"}  # fmt: skip
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env,
                   check=True, cwd=ROOT)  # fmt: skip

    import django

    django.setup()
    from django.contrib.auth.models import User

    from scheduler.jobs.submit import submit_job

    User.objects.create_user("bench", password="bench-pass-123")
    spec = {"name": "latency", "tasks": [{"name": "main", "command": "true"}]}
    job = submit_job(User.objects.get(username="bench"), spec)

    port = free_port()
    server = start_daphne(port, env, data / "daphne.log")
    url = f"http://127.0.0.1:{port}"
    try:
        latencies = asyncio.run(measure(url, job.pk, args.updates, args.gap))
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(json.dumps({
        "updates": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p95_ms": round(percentile(latencies, 0.95), 1),
        "max_ms": round(max(latencies), 1),
        "mean_ms": round(statistics.mean(latencies), 1),
        "path": "commit in this process -> dashboard.live render -> Redis -> daphne -> websocket"
                " -> htmx out-of-band swap -> DOM",
    }, indent=1))  # fmt: skip


def commit_change(job_id: int, i: int) -> float:
    """A change as the scheduler commits it; returns the commit time (ms since the epoch)."""
    from django.db import connections, transaction

    from scheduler import notify
    from scheduler.models import Job

    try:
        with transaction.atomic():
            Job.objects.filter(pk=job_id).update(reason="Bench", message=f"tick-{i}")
            notify.changed(jobs=[job_id])
            committed = time.time() * 1000  # the push runs right after commit, on exit
        return committed
    finally:
        connections.close_all()


async def measure(url: str, job_id: int, updates: int, gap: float) -> list[float]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = await browser.new_page()
        await page.goto(f"{url}/accounts/login/")
        await page.fill("input[name=username]", "bench")
        await page.fill("input[name=password]", "bench-pass-123")
        await page.click("form.card button[type=submit]")
        await page.wait_for_url(f"{url}/")
        await page.goto(f"{url}/jobs/{job_id}/")
        await page.wait_for_function("() => document.querySelector('[ws-connect]') !== null")
        await page.wait_for_timeout(500)  # let the socket open
        # Read only the status section's text on each mutation: cheap, so the observer itself
        # adds next to nothing to what is measured.
        await page.evaluate(
            """(id) => {
            window.__seen = {};
            new MutationObserver(() => {
                const status = document.getElementById(`job-${id}-status`);
                const m = status && status.textContent.match(/tick-(\\d+)/);
                if (m && !(m[1] in window.__seen)) window.__seen[m[1]] = Date.now();
            }).observe(document.body, {childList: true, subtree: true, characterData: true});
        }""",
            job_id,
        )
        latencies = []
        for i in range(updates):
            committed = await asyncio.to_thread(commit_change, job_id, i)
            await page.wait_for_function(f"() => '{i}' in window.__seen", timeout=10000)
            seen = await page.evaluate(f"() => window.__seen['{i}']")
            latencies.append(max(0.0, seen - committed))
            await asyncio.sleep(gap)
        await browser.close()
    return latencies


if __name__ == "__main__":
    main()
