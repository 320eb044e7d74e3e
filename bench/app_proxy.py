"""The app proxy (/apps/<job>/, docs/interactive.md#web-apps) against a direct connection:
download throughput (MB/s) per size and small-request latency (ms), then C clients at once
(every HTTP status seen: only 200, or 503 with Retry-After, may appear), printed as JSON.

    python bench/app_proxy.py --sizes 1M,10M,100M --requests 300 --clients 16

Uses a database of its own (DATABASE_URL's server, database `berth_bench_apps`), recreated
each run, holding one user, one node at 127.0.0.1 and one running job whose app task
reports the port of a small HTTP server (a process of its own that answers GET /N with N
bytes, kept alive). Berth runs as `./run serve` runs it (uvicorn serving berth/asgi.py, one
worker); each request goes with the user's API token, as `curl` would send it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BENCH_SECRET_KEY  # noqa: E402
from bench.processes import free_port, stop_groups  # noqa: E402

# The app: GET /<n> answers n bytes, from one buffer, with keep-alive.
UPSTREAM = r"""
import asyncio, sys
CHUNK = b"x" * (1 << 20)
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            size = int(head.split(b" ", 2)[1].lstrip(b"/") or 0)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                         b"content-length: %d\r\n\r\n" % size)
            while size > 0:
                part = CHUNK[: min(size, len(CHUNK))]
                writer.write(part)
                size -= len(part)
                await writer.drain()
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


def setup_database(database: str) -> str:
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS berth_bench_apps WITH (FORCE)")
        conn.execute("CREATE DATABASE berth_bench_apps")
    return database.rsplit("/", 1)[0] + "/berth_bench_apps"


def make_job(app_port: int) -> tuple[int, str]:
    """A user, a node at 127.0.0.1 and a running job whose app listens on `app_port`."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from scheduler.models import Job, Node, Queue, Task

    user = User.objects.create_user("bench")
    node = Node.objects.create(name="bench-node", cpu=1000, memory=2**30, address="127.0.0.1")
    job = Job.objects.create(name="app", owner=user, queue=Queue.objects.get(name="default"),
                             spec={"apps": [{"kind": "http"}], "tasks": []},
                             state="Running")  # fmt: skip
    Task.objects.create(job=job, group="main", index=0, state="Running", node=node,
                        app_port=app_port)  # fmt: skip
    return job.pk, Token.objects.create(user=user).key


def download(client: httpx.Client, url: str, size: int, repeat: int) -> float:
    """Best MB/s of `repeat` downloads of `size` bytes."""
    best = 0.0
    for _ in range(repeat):
        tick = time.perf_counter()
        got = 0
        with client.stream("GET", f"{url}{size}") as response:
            assert response.status_code == 200, (url, response.status_code)
            for chunk in response.iter_raw(1 << 20):
                got += len(chunk)
        assert got == size, (got, size)
        best = max(best, size / (time.perf_counter() - tick) / 1e6)
    return round(best, 1)


def latency(client: httpx.Client, url: str, requests: int) -> dict[str, float]:
    times = []
    for _ in range(requests):
        tick = time.perf_counter()
        assert client.get(f"{url}100").status_code == 200
        times.append((time.perf_counter() - tick) * 1000)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 2),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2)}  # fmt: skip


def crowd(url: str, headers: dict[str, str], clients: int, requests: int) -> dict[str, Any]:
    """`clients` clients at once, each with its own connection, `requests` small GETs each:
    every status seen (503s counted with and without Retry-After), latency, requests/s."""

    def one_client(_: int) -> tuple[Counter[str], list[float]]:
        seen: Counter[str] = Counter()
        times: list[float] = []
        with httpx.Client(timeout=60, headers=headers) as client:
            for _ in range(requests):
                tick = time.perf_counter()
                try:
                    response = client.get(f"{url}100")
                except httpx.HTTPError as exc:
                    seen[type(exc).__name__] += 1
                    continue
                times.append((time.perf_counter() - tick) * 1000)
                status = str(response.status_code)
                if status == "503" and "retry-after" not in response.headers:
                    status = "503 without Retry-After"
                seen[status] += 1
        return seen, times

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one_client, range(clients)))
    seconds = time.perf_counter() - began
    statuses: Counter[str] = sum((seen for seen, _ in results), Counter())
    times = sorted(t for _, some in results for t in some)
    at = min(len(times) - 1, int(len(times) * 0.99)) if times else 0
    return {"clients": clients, "requests": clients * requests, "statuses": dict(statuses),
            "requests_per_s": round(clients * requests / seconds, 1),
            "p50_ms": round(statistics.median(times), 2) if times else None,
            "p99_ms": round(times[at], 2) if times else None}  # fmt: skip


def measure(args: argparse.Namespace, direct: str, proxied: str, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Token {token}"}
    out: dict[str, Any] = {"downloads": []}
    with httpx.Client(timeout=300) as plain, httpx.Client(timeout=300, headers=headers) as auth:
        latency(auth, proxied, 20)  # warm: connections, imports, the first queries
        for size in args.sizes:
            row = {"bytes": size, "direct_mb_s": download(plain, direct, size, args.repeat),
                   "proxy_mb_s": download(auth, proxied, size, args.repeat)}  # fmt: skip
            row["proxy_vs_direct"] = round(row["proxy_mb_s"] / row["direct_mb_s"], 3)
            out["downloads"].append(row)
        out["latency_direct"] = latency(plain, direct, args.requests)
        out["latency_proxy"] = latency(auth, proxied, args.requests)
    if args.clients:
        out["concurrent"] = crowd(proxied, headers, args.clients, args.requests)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M,100M", help="download sizes: 100K,10M,...")
    parser.add_argument("--requests", type=int, default=300, help="small requests timed")
    parser.add_argument("--repeat", type=int, default=3, help="downloads per size (best kept)")
    parser.add_argument("--clients", type=int, default=16,
                        help="clients at once, --requests each (0: no crowd)")  # fmt: skip
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.requests < 1 or args.repeat < 1 or not args.sizes or args.clients < 0:
        parser.error("--requests, --repeat and --sizes must be at least 1, --clients 0 or more")
    env = {**os.environ, "DATABASE_URL": setup_database(args.database),
           "BERTH_SECRET_KEY": BENCH_SECRET_KEY, "BERTH_ALLOWED_HOSTS": "127.0.0.1"}  # fmt: skip
    env.pop("REDIS_URL", None)  # the proxy needs no channel layer
    os.environ.update(env)
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env,
                   check=True, cwd=ROOT)  # fmt: skip
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    import django

    django.setup()
    app_port, berth_port = free_port(), free_port()
    job_id, token = make_job(app_port)
    procs = [
        subprocess.Popen([sys.executable, "-c", UPSTREAM, str(app_port)], start_new_session=True),
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "berth.asgi:application", "--port", str(berth_port),
             "--no-access-log", "--log-level", "warning"],
            cwd=ROOT, env=env, start_new_session=True,
        ),
    ]  # fmt: skip
    try:
        proxied = f"http://127.0.0.1:{berth_port}/apps/{job_id}/"
        _wait(proxied, token)
        result = measure(args, f"http://127.0.0.1:{app_port}/", proxied, token)
    finally:
        stop_groups(procs)
    print(json.dumps({"bench": "app_proxy", "server": "uvicorn, 1 worker", **result}, indent=1))


def _wait(url: str, token: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}1", headers={"Authorization": f"Token {token}"}).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the proxy did not answer")


if __name__ == "__main__":
    main()
