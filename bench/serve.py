"""Web tier under a burst of job submissions: compare serving stacks and worker counts.

Starts one server as a real process on PostgreSQL and Redis (database `--database-name`,
default `berth_bench_serve`, on DATABASE_URL's server, dropped and recreated; `--nodes`
registered nodes), submits N jobs from C concurrent HTTP clients and prints one JSON object:
accepted/s, submit latency p50/p99, status-code counts, the server's PostgreSQL connections
(peak during the run, at rest before and after), and the server's CPU time per request
(comparable across runs on a busy machine, unlike rates).

    python bench/serve.py --stack serve --workers 4 --jobs 800 --clients 16 [--nodes 100]
    python bench/serve.py --stack daphne --jobs 800 --clients 16

Stacks: `serve` (./run serve: gunicorn + uvicorn workers), `daphne` (one daphne process, the
old production command), `wsgi` (gunicorn gthread workers, HTTP only: no websockets).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BENCH_SECRET_KEY, post_json  # noqa: E402
from bench.processes import add_database_options, free_port  # noqa: E402

APP_NAME = "berth-bench-web"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def cpu_seconds(group: int) -> float:
    """CPU time (user + system) used so far by the live processes of a process group: the
    cost of the work itself, whatever else the machine is running."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def server_command(stack: str, port: int, workers: int) -> list[str]:
    if stack == "serve":
        return [str(ROOT / "run"), "serve", "--port", str(port), "--workers", str(workers)]
    if stack == "daphne":
        return [sys.executable, "-m", "daphne", "-p", str(port), "berth.asgi:application"]
    return [
        sys.executable, "-m", "gunicorn", "django.core.wsgi:get_wsgi_application()",
        "--worker-class", "gthread", "--threads", "8", "--workers", str(workers),
        "--bind", f"127.0.0.1:{port}", "--no-control-socket",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", choices=("serve", "daphne", "wsgi"), default="serve")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=800)
    parser.add_argument("--clients", type=int, default=16)
    add_database_options(parser, "berth_bench_serve")
    parser.add_argument("--nodes", type=int, default=0,
                        help="registered nodes (64 CPUs, 512Gi) the never-fits check reads;"
                             " bench/e2e.py starts 100")  # fmt: skip
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per registered node")
    args = parser.parse_args()
    if not args.database_name.replace("_", "").isalnum() or args.nodes < 0 or args.gpus < 0:
        parser.error("--database-name: letters, digits, _; --nodes and --gpus: 0 or more")
    for name in ("workers", "jobs", "clients"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    import psycopg

    base = args.database.rsplit("/", 1)[0]
    work = Path(tempfile.mkdtemp(prefix="berth-serve-bench-"))
    env = {
        **os.environ,
        "DATABASE_URL": f"{base}/{args.database_name}",
        "REDIS_URL": args.redis,
        "BERTH_SECRET_KEY": BENCH_SECRET_KEY,
        "BERTH_DATA_DIR": str(work),
        "BERTH_CHANNEL_PREFIX": "berth-bench-serve",
        "BERTH_DB_APPLICATION_NAME": APP_NAME,
        "DJANGO_SETTINGS_MODULE": "berth.settings",
    }
    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database_name}"')
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    make_token = (
        "from django.contrib.auth.models import User;"
        "from rest_framework.authtoken.models import Token;"
        "from scheduler.models import Device, Node;"
        f"nodes = Node.objects.bulk_create(Node(name=f'sim-{{i:04d}}', cpu=64000,"
        f" memory=512 * 2**30) for i in range({args.nodes}));"
        f"Device.objects.bulk_create(Device(node=n, index=i) for n in nodes"
        f" for i in range({args.gpus}));"
        "print(Token.objects.create(user=User.objects.create_user('bench')).key)"
    )
    token = subprocess.run(
        [*manage, "shell", "-c", make_token], env=env, check=True, cwd=ROOT,
        capture_output=True, text=True,
    ).stdout.split()[-1]  # fmt: skip

    def server_connections() -> int:
        with psycopg.connect(args.database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
            ).fetchone()
        return int(row[0]) if row else 0

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        server_command(args.stack, port, args.workers), env=env, cwd=ROOT,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/accounts/login/", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"server did not start: see {work / 'server.log'}") from None
                time.sleep(0.2)
        headers = {"Authorization": f"Token {token}"}
        for _ in range(4 * args.workers):  # let every worker open its pool
            post_json(f"{url}/api/v1/jobs/?page_size=1", None, headers, method="GET")
        time.sleep(1)
        at_rest = server_connections()

        peak = at_rest
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, server_connections())
                done.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        spec = {
            "name": "bench",
            "tasks": [{"name": "main", "command": "true", "resources": {"cpu": "0.5", "gpu": 1}}],
        }
        statuses: Counter[int] = Counter()
        latencies: list[float] = []

        def submit(_: int) -> None:
            started = time.monotonic()
            status, _body = post_json(f"{url}/api/v1/jobs/", spec, headers, retries=0)
            latencies.append(time.monotonic() - started)
            statuses[status] += 1

        cpu_before = cpu_seconds(proc.pid)
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(submit, range(args.jobs)))
        seconds = time.monotonic() - t0
        server_cpu = cpu_seconds(proc.pid) - cpu_before
        done.set()
        watcher.join()
        time.sleep(1)
        print(
            json.dumps(
                {
                    "stack": args.stack,
                    "workers": args.workers if args.stack != "daphne" else 1,
                    "jobs": args.jobs,
                    "clients": args.clients,
                    "accepted_per_s": round(statuses[201] / seconds, 1),
                    "submit_latency_ms": {
                        "p50": round(percentile(latencies, 0.5) * 1000, 1),
                        "p99": round(percentile(latencies, 0.99) * 1000, 1),
                    },
                    "server_cpu_ms_per_request": round(server_cpu * 1000 / args.jobs, 1),
                    "load_average_1m": round(os.getloadavg()[0], 1),
                    "status_codes": {str(k): v for k, v in sorted(statuses.items())},
                    "db_connections": {
                        "at_rest": at_rest,
                        "peak": peak,
                        "after": server_connections(),
                    },
                },
                indent=1,
            )
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


if __name__ == "__main__":
    main()
