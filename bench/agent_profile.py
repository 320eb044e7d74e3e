"""What a job costs the web process after it is accepted: the agent protocol's requests.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/agent_profile.py --nodes 20 --per-lease 1 --rounds 10 [--profile 25]

Creates a fresh database (`--database-name`, dropped at the end) and registers `--nodes`
nodes of `--gpus` GPUs each through the protocol. Each round, for every node, places
`--per-lease` one-GPU tasks on it as the scheduler does (Assigned, devices allocated; not
measured), then measures the three requests protocol 3 spends on them:

- `lease_start`: a lease (`wait` 0) whose answer carries the node's new tasks to start;
- `lease_confirm`: the next lease, listing them Running, which confirms their start;
- `report_final`: the final report, every task Succeeded with its output inline.

Leases go through `LeaseApp` (the ASGI app `./run serve` routes `lease/` to, with its
channel-layer subscription) on one long-lived event loop, as in a web worker; reports through
Django's test client with the whole middleware stack. Prints JSON: per request kind, CPU ms
of this process (`time.process_time`, every thread) per task, SQL statements per task
(BEGIN and COMMIT not counted) and wall ms per request. `--profile N` prints cProfile's top
N functions (of the requesting thread; the lease's database work runs in another thread).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
os.environ.setdefault(
    "BERTH_SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop-agent-profile-0123"
)
os.environ.setdefault("BERTH_JOIN_TOKEN", "bench-join-token")

import django  # noqa: E402
from cycle_db import QueryMeter, median_run  # noqa: E402

GI = 1 << 30
KINDS = ("lease_start", "lease_confirm", "report_final")
OUTPUT = "simulated task {} on {}: exit 0\n"  # what run_simagent's tasks print


class AllThreadsMeter(QueryMeter):
    """A QueryMeter installed on every connection a thread opens while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.statements: list[str] = []  # of the request measured last

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.statements.append(sql)
        return super().__call__(execute, sql, params, many, context)


@contextmanager
def metered(meter: AllThreadsMeter) -> Iterator[None]:
    from django.db import connections

    meter.on = True
    try:
        with connections["default"].execute_wrapper(meter):
            yield
    finally:
        meter.on = False


def install_meter(meter: AllThreadsMeter) -> None:
    """Every new connection wrapper (the lease's worker thread has its own) counts queries."""
    from django.db.backends.signals import connection_created

    def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
        if not any(w is _gate for w in connection.execute_wrappers):
            connection.execute_wrappers.append(_gate)

    def _gate(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if meter.on and not _is_main():
            return meter(execute, sql, params, many, ctx)
        return execute(sql, params, many, ctx)

    connection_created.connect(wrap, weak=False)


def _is_main() -> bool:
    return threading.current_thread() is threading.main_thread()


class Server:
    """One event loop in a thread of its own, serving `LeaseApp` as a web worker would."""

    def __init__(self) -> None:
        from scheduler.agentapi.views import LeaseApp

        self.app = LeaseApp()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def lease(self, token: str, body: dict[str, Any]) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(self._call(token, body), self.loop)
        status, answer = future.result(timeout=30)
        if status != 200:
            raise SystemExit(f"lease answered {status}: {answer}")
        return dict(answer)

    async def _call(self, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        raw = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/api/v1/agent/lease/",
                 "raw_path": b"/api/v1/agent/lease/", "query_string": b"", "root_path": "",
                 "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(raw)).encode()),
                             (b"authorization", f"Node {token}".encode()),
                             (b"berth-agent-protocol", b"3")]}  # fmt: skip
        sent: list[Mapping[str, Any]] = []
        chunks = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if chunks:
                return chunks.pop()
            await asyncio.sleep(3600)  # the agent never goes away here
            return {"type": "http.disconnect"}

        async def send(message: Mapping[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return int(status), json.loads(body_out)


def register_nodes(n: int, gpus: int) -> list[tuple[int, str]]:
    from django.contrib.auth.models import User

    from scheduler.agentapi.register import register

    User.objects.create_user("bench")
    nodes = []
    for i in range(n):
        answer = register({
            "name": f"sim-{i:04d}", "cpu": 64000, "memory": 512 * GI, "hostname": f"sim-{i:04d}",
            "devices": [{"index": d, "uuid": f"sim-{i}-{d}", "model": "sim", "memory": 16 * GI}
                        for d in range(gpus)]})  # fmt: skip
        from scheduler.models import Node

        nodes.append((Node.objects.get(name=answer["node"]).pk, answer["token"]))
    return nodes


def place(node_id: int, per_lease: int, duration: float) -> None:
    """`per_lease` one-GPU jobs' tasks Assigned to the node, devices allocated, as a cycle's
    commit leaves them (one transaction)."""
    from django.contrib.auth.models import User
    from django.db import transaction
    from django.utils import timezone

    from scheduler.models import Allocation, Device, Job, Queue, Task
    from scheduler.states.names import JobState, TaskState

    owner, queue, now = User.objects.get(), Queue.objects.get(name="default"), timezone.now()
    spec = {"name": "bench", "queue": "default", "tasks": [{
        "name": "main", "replicas": 1, "command": "true",
        "env": {"BERTH_SIM_DURATION": str(duration)},
        "resources": {"cpu": "0.5", "memory": "1Gi", "gpu": 1}, "node_selector": {}}]}  # fmt: skip
    with transaction.atomic():
        free = list(Device.objects.filter(node_id=node_id, allocations__isnull=True)[:per_lease])
        jobs = Job.objects.bulk_create(
            Job(name="bench", owner=owner, queue=queue, spec=spec, state=JobState.PENDING)
            for _ in free
        )
        tasks = Task.objects.bulk_create(
            Task(job=job, group="main", index=0, cpu=500, memory=GI, gpu=1, node_id=node_id,
                 state=TaskState.ASSIGNED, assigned_at=now, device_indices=[device.index])
            for job, device in zip(jobs, free, strict=True)
        )  # fmt: skip
        Allocation.objects.bulk_create(
            Allocation(device=d, task=t) for d, t in zip(free, tasks, strict=True)
        )


class Costs:
    def __init__(self) -> None:
        self.cpu = dict.fromkeys(KINDS, 0.0)
        self.wall = dict.fromkeys(KINDS, 0.0)
        self.requests = dict.fromkeys(KINDS, 0)
        self.queries = dict.fromkeys(KINDS, 0)
        self.statements: dict[str, list[str]] = {}

    def timed(self, kind: str, meter: AllThreadsMeter, fn: Callable[[], Any]) -> Any:
        before = meter.queries
        meter.statements = []
        wall, cpu = time.perf_counter(), time.process_time()
        with metered(meter):
            result = fn()
        self.cpu[kind] += time.process_time() - cpu
        self.wall[kind] += time.perf_counter() - wall
        self.queries[kind] += meter.queries - before
        self.requests[kind] += 1
        self.statements[kind] = meter.statements
        return result


def one_round(
    args: argparse.Namespace, server: Server, client: Any, nodes: list[tuple[int, str]],
    meter: AllThreadsMeter, costs: Costs | None,
) -> None:  # fmt: skip
    c = costs or Costs()
    for node_id, token in nodes:
        place(node_id, args.per_lease, args.duration)
        answer = c.timed("lease_start", meter, partial(server.lease, token, {"wait": 0}))
        started = [{"id": s["id"], "attempt": s["attempt"], "state": "Running"}
                   for s in answer["start"]]  # fmt: skip
        if len(started) != args.per_lease:
            raise SystemExit(f"lease carried {len(started)} starts, not {args.per_lease}")
        body = {"tasks": started, "wait": 0}
        c.timed("lease_confirm", meter, partial(server.lease, token, body))
        final = [{**s, "state": "Succeeded", "exit_code": 0, "output_bytes": len(text.encode()),
                  "output": {"offset": 0, "data": text}}
                 for s in started for text in [OUTPUT.format(s["id"], node_id)]]  # fmt: skip
        c.timed("report_final", meter, partial(report, client, token, final))


def report(client: Any, token: str, tasks: list[dict[str, Any]]) -> None:
    response = client.post("/api/v1/agent/report/", data=json.dumps({"tasks": tasks}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Node {token}",
                           HTTP_BERTH_AGENT_PROTOCOL="3")  # fmt: skip
    if response.status_code != 200:
        raise SystemExit(f"report answered {response.status_code}: {response.content[:300]!r}")


def measure(args: argparse.Namespace, server: Server, meter: AllThreadsMeter) -> dict[str, Any]:
    from django.test import Client

    client = Client(SERVER_NAME="127.0.0.1")
    nodes = register_nodes(args.nodes, args.gpus)
    one_round(args, server, client, nodes, meter, None)  # warm-up, not counted
    costs = Costs()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    for _ in range(args.rounds):
        one_round(args, server, client, nodes, meter, costs)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
    tasks = args.rounds * args.nodes * args.per_lease
    if args.sql:
        for kind, statements in costs.statements.items():
            print(f"--- {kind}", *(s[:160] for s in statements), sep="\n", file=sys.stderr)
    out: dict[str, Any] = {"nodes": args.nodes, "per_lease": args.per_lease,
                           "rounds": args.rounds, "tasks": tasks}  # fmt: skip
    for kind in KINDS:
        out[kind] = {
            "cpu_ms_per_task": round(costs.cpu[kind] * 1000 / tasks, 2),
            "sql_per_task": round(costs.queries[kind] / tasks, 2),
            "wall_ms_per_request": round(costs.wall[kind] * 1000 / costs.requests[kind], 2),
        }
    out["cpu_ms_per_task_total"] = round(sum(costs.cpu.values()) * 1000 / tasks, 2)
    out["sql_per_task_total"] = round(sum(costs.queries.values()) / tasks, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20, help="registered nodes")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--per-lease", type=int, default=1,
                        help="tasks placed per node per round: one lease's starts")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds")
    parser.add_argument("--duration", type=float, default=0.5, help="BERTH_SIM_DURATION")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is shown")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's top N functions to stderr")  # fmt: skip
    parser.add_argument("--sql", action="store_true",
                        help="print each kind's last request's SQL to stderr")  # fmt: skip
    parser.add_argument("--database-name", default="bench_agent_profile")
    args = parser.parse_args()
    if min(args.nodes, args.rounds, args.repeat, args.per_lease) < 1:
        parser.error("--nodes, --rounds, --repeat and --per-lease must be at least 1")
    if args.per_lease > args.gpus:
        parser.error("--per-lease: at most --gpus (each task takes one GPU)")
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        parser.error("needs PostgreSQL: set DATABASE_URL=postgres://user@host:port/db")
    django.setup()
    meter = AllThreadsMeter()
    install_meter(meter)
    server = Server()
    result = median_run(
        args.repeat,
        args.database_name,
        lambda: measure(args, server, meter),
        "cpu_ms_per_task_total",
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
