"""End-to-end throughput: submit N short jobs over REST and time them to completion.

Starts, as real processes on this machine: the web server (daphne), `run_scheduler` and
`run_simagent` (many fake nodes over the agent protocol), all on PostgreSQL and Redis. Submits
N jobs from concurrent HTTP clients, samples the database every interval, and prints one JSON
object: jobs/s accepted, started and finished end to end, scheduler cycle times, and queue
depth over time.

    python bench/e2e.py --nodes 200 --gpus 8 --jobs 2000 --clients 8

Uses a database of its own (DATABASE_URL's server, database `berth_bench`), dropped and
recreated each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per simulated node")
    parser.add_argument("--cpu", default="64", help="cpu per simulated node")
    parser.add_argument("--memory", default="512Gi", help="memory per simulated node")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=0.5, help="seconds each job runs")
    parser.add_argument("--clients", type=int, default=8, help="concurrent submitting clients")
    parser.add_argument("--interval", type=float, default=0.5, help="scheduler interval (s)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    for name in ("nodes", "gpus", "jobs", "clients"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    base = args.database.rsplit("/", 1)[0]
    db_url = f"{base}/berth_bench"
    work = Path(tempfile.mkdtemp(prefix="berth-e2e-"))
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": args.redis,
        "BERTH_SECRET_KEY": "bench",
        "BERTH_JOIN_TOKEN": "bench-join",
        "BERTH_SCHEDULER_INTERVAL": str(args.interval),
        "BERTH_HEARTBEAT_INTERVAL": "0.5",
        "BERTH_HEARTBEAT_TIMEOUT": "60",
        "BERTH_DATA_DIR": str(work),
        "BERTH_CHANNEL_PREFIX": "berth-bench",
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "BERTH_SECRET_KEY")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")

    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS berth_bench WITH (FORCE)")
        conn.execute("CREATE DATABASE berth_bench")
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db.models import Count
    from rest_framework.authtoken.models import Token

    from scheduler.models import Job, Node

    user = User.objects.create_user("bench")
    token = Token.objects.create(user=user).key

    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        out = open(work / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append(proc)
        return proc

    url = f"http://127.0.0.1:{port}"
    start(
        "web",
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "berth.asgi:application",
        ],
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/schema/", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        start(
            "simagent",
            [
                *manage,
                "run_simagent",
                "--server",
                url,
                "--join-token",
                "bench-join",
                "--nodes",
                str(args.nodes),
                "--gpus",
                str(args.gpus),
                "--cpu",
                args.cpu,
                "--memory",
                args.memory,
            ],
        )
        while Node.objects.count() < args.nodes and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        start("scheduler", [*manage, "run_scheduler", "--interval", str(args.interval)])

        samples: list[dict[str, Any]] = []
        done = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not done.is_set():
                counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
                samples.append({"t": round(time.monotonic() - t0, 2), **counts})
                done.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        body = json.dumps(
            {
                "name": "bench",
                "tasks": [
                    {
                        "name": "main",
                        "command": "true",
                        "resources": {"cpu": "0.5", "memory": "1Gi", "gpu": 1},
                        "env": {"BERTH_SIM_DURATION": str(args.duration)},
                    }
                ],
            }
        ).encode()
        latencies: list[float] = []
        failures = 0

        def submit(_: int) -> None:
            nonlocal failures
            request = urllib.request.Request(
                f"{url}/api/v1/jobs/",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Token {token}"},
            )
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
                latencies.append(time.monotonic() - started)
            except Exception:
                failures += 1

        submit_start = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(submit, range(args.jobs)))
        submit_seconds = time.monotonic() - submit_start

        finished_states = ("Succeeded", "Failed", "Cancelled")
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if Job.objects.filter(state__in=finished_states).count() >= args.jobs - failures:
                break
            time.sleep(0.2)
        total_seconds = time.monotonic() - submit_start
        done.set()
        sampler.join()

        jobs = list(Job.objects.values_list("created_at", "started_at", "finished_at", "state"))
        starts = sorted(j[1] for j in jobs if j[1])
        ends = sorted(j[2] for j in jobs if j[2])
        first_submit = min(j[0] for j in jobs) if jobs else None
        cycles = [
            float(m)
            for m in re.findall(
                r"cycle .*?schedule=([\d.]+)ms", (work / "scheduler.log").read_text()
            )
        ]
        totals = [
            sum(float(x) for x in re.findall(r"=([\d.]+)ms", line))
            for line in (work / "scheduler.log").read_text().splitlines()
            if " cycle " in f" {line}"
        ]
        waits = [(j[1] - j[0]).total_seconds() for j in jobs if j[1]]

        def rate(times: list[Any]) -> float:
            if len(times) < 2 or first_submit is None:
                return 0.0
            return round(len(times) / max(1e-9, (times[-1] - first_submit).total_seconds()), 1)

        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "gpus_per_node": args.gpus,
                    "jobs": args.jobs,
                    "clients": args.clients,
                    "job_duration_s": args.duration,
                    "submit_failures": failures,
                    "accepted_per_s": round((args.jobs - failures) / submit_seconds, 1),
                    "submit_latency_ms": {
                        "p50": round(percentile(latencies, 0.5) * 1000, 1),
                        "p95": round(percentile(latencies, 0.95) * 1000, 1),
                    },
                    "started_per_s": rate(starts),
                    "finished_per_s": rate(ends),
                    "end_to_end_seconds": round(total_seconds, 2),
                    "succeeded": sum(1 for j in jobs if j[3] == "Succeeded"),
                    "wait_to_start_s": {
                        "p50": round(percentile(waits, 0.5), 2),
                        "p95": round(percentile(waits, 0.95), 2),
                    },
                    "cycle_ms": {
                        "schedule_p50": round(statistics.median(cycles), 1) if cycles else None,
                        "total_p50": round(statistics.median(totals), 1) if totals else None,
                        "total_max": round(max(totals), 1) if totals else None,
                        "cycles": len(totals),
                    },
                    "queue_depth": [
                        {
                            "t": s["t"],
                            "pending": s.get("Pending", 0),
                            "running": s.get("Running", 0),
                            "finished": sum(s.get(k, 0) for k in finished_states),
                        }
                        for s in samples
                    ],
                },
                indent=1,
            )
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
