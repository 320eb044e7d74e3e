"""What one job submission costs the web process: CPU ms and SQL statements per submit.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/submit_profile.py --submits 300 [--nodes 100 --gpus 8] [--profile 25]

Creates a fresh database (`--database-name`, dropped at the end), `--nodes` registered nodes
of `--gpus` GPUs each (as `bench/e2e.py` starts; the never-fits check reads them), a user
with a DRF token (as `bench/e2e.py` makes) or a self-service token (`--token-kind api`), and
submits the one-GPU job of `bench/e2e.py` (`POST /api/v1/jobs/`) through Django's test
client with the whole middleware stack, after `--warmup` unmeasured ones. Prints JSON, per
submit: the CPU time of this process (`time.process_time`), the wall time, the SQL
statements (BEGIN and COMMIT not counted) and the time inside them, the CPU time of the live
push after commit (`dashboard.live.publish`), and the CPU time of the PostgreSQL backend
serving it (from /proc, when the server runs on this machine; null otherwise). `--profile N`
prints cProfile's top N functions to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
os.environ.setdefault("BERTH_SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop")

import django  # noqa: E402
from cycle_db import QueryMeter, median_run  # noqa: E402
from e2e import job_body  # noqa: E402


class Timer:
    """Wraps a function and adds up the CPU time spent in it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - start


def make_token(kind: str) -> str:
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from scheduler.ops.tokens import create_token

    user = User.objects.create_user("bench")
    if kind == "api":
        return create_token(user, "bench")[1]
    return str(Token.objects.create(user=user).key)


def make_nodes(count: int, gpus: int) -> None:
    """`count` Ready nodes as bench/e2e.py's simulated ones (64 CPUs, 512Gi, `gpus` GPUs)."""
    from scheduler.core.quantity import parse_memory
    from scheduler.models import Device, Node

    nodes = Node.objects.bulk_create(
        Node(name=f"sim-{i:04d}", cpu=64_000, memory=parse_memory("512Gi")) for i in range(count)
    )
    Device.objects.bulk_create(
        Device(node=node, index=i, uuid=f"{node.name}-gpu{i}")
        for node in nodes
        for i in range(gpus)
    )


def backend_cpu_seconds(pid: int) -> float | None:
    """CPU time of this connection's PostgreSQL backend, when it runs on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def submit_loop(client: Any, token: str, n: int, body: dict[str, Any]) -> None:
    for _ in range(n):
        response = client.post("/api/v1/jobs/", data=json.dumps(body),
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Token {token}")  # fmt: skip
        if response.status_code != 201:
            raise SystemExit(f"submit answered {response.status_code}: {response.content[:300]!r}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client

    import dashboard.live

    push = Timer(dashboard.live.publish)
    dashboard.live.publish = push  # type: ignore[assignment]  # notify imports it per call
    make_nodes(args.nodes, args.gpus)
    token = make_token(args.token_kind)
    client = Client(SERVER_NAME="127.0.0.1")
    body = job_body(0.5)
    submit_loop(client, token, args.warmup, body)
    meter = QueryMeter()
    push.seconds = 0.0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = int(cursor.fetchone()[0])
    backend_before = backend_cpu_seconds(backend)
    profiler = cProfile.Profile() if args.profile else None
    with connection.execute_wrapper(meter):
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        submit_loop(client, token, args.submits, body)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    backend_after = backend_cpu_seconds(backend)
    if profiler:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
    n = args.submits
    return {
        "submits": n,
        "token": args.token_kind,
        "nodes": args.nodes,
        "cpu_ms_per_submit": round(cpu * 1000 / n, 2),
        "wall_ms_per_submit": round(wall * 1000 / n, 2),
        "sql_statements_per_submit": round(meter.queries / n, 2),
        "in_database_ms_per_submit": round(meter.seconds * 1000 / n, 2),
        "postgres_backend_cpu_ms_per_submit": (
            round((backend_after - backend_before) * 1000 / n, 2)
            if backend_before is not None and backend_after is not None
            else None
        ),
        "live_push_cpu_ms_per_submit": round(push.seconds * 1000 / n, 2),
        "profiled": bool(profiler),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submits", type=int, default=300, help="measured submissions")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured submissions first")
    parser.add_argument("--nodes", type=int, default=100, help="registered nodes (as e2e)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--token-kind", choices=["drf", "api"], default="drf")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is shown")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's top N functions to stderr")  # fmt: skip
    parser.add_argument("--database-name", default="bench_submit_profile")
    args = parser.parse_args()
    if args.submits < 1 or args.repeat < 1:
        parser.error("--submits and --repeat must be at least 1")
    if args.nodes < 0 or args.gpus < 0:
        parser.error("--nodes and --gpus must not be negative")
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        parser.error("needs PostgreSQL: set DATABASE_URL=postgres://user@host:port/db")
    django.setup()
    result = median_run(args.repeat, args.database_name, lambda: measure(args), "cpu_ms_per_submit")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
