"""Time full scheduler cycles against PostgreSQL: where a cycle's time goes, phase by phase.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        python bench/cycle_db.py --nodes 200 --gpus 8 --jobs 1000

Creates a fresh database (`--database-name`, dropped at the end), fills it with `--nodes`
Ready nodes of `--gpus` devices each and `--jobs` pending one-task, one-GPU jobs, and runs
full cycles through `scheduler.cycle.loop.run_scheduler_cycle`:

- `place`: the first cycle, which places the backlog (as many jobs as there are GPUs);
- `steady`: the median of `--steady` cycles in which nothing changes;
- `started`: every placed task reported Running (one UPDATE, as agents would): jobs go Running;
- `finished`: every task Succeeded and its devices released: jobs go Succeeded.

With `--idle-seconds S`, after `started` the scheduler loop itself (`run_loop`, housekeeping
once a second, `--interval` apart) runs for S seconds on that cluster where nothing changes
(every job running): `idle` shows the cycles run and skipped and the CPU the loop's process
and its PostgreSQL backend spent per second (from /proc), the steady drain of a quiet cluster.

Prints JSON: per cycle, the wall time of each phase (load, core, commit, flows, lifecycle,
publish, total) in ms, the time spent inside database calls and the number of queries.
`db_phases_ms` is what the cycle spends outside the pure core and the live push: load + commit
+ flows + lifecycle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
os.environ.setdefault("BERTH_SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop")

import django  # noqa: E402

from scheduler.cycle.meter import QueryMeter  # noqa: E402

GI = 1 << 30
PHASES = ("load", "core", "commit", "flows", "lifecycle", "publish")
DB_PHASES = ("load", "commit", "flows", "lifecycle")
# What older loops called their phases (for a "before" figure from an older checkout).
OLD_NAMES = {"snapshot": "load", "schedule": "core", "requests": "lifecycle", "ttl": "lifecycle"}


@contextmanager
def fresh_database(name: str) -> Iterator[None]:
    from django.db import connection

    connection.settings_dict.setdefault("TEST", {})["NAME"] = name
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


def median_run(
    repeat: int, database_name: str, measure: Callable[[], dict[str, Any]], key: str
) -> dict[str, Any]:
    """Run `measure` `repeat` times, each on a fresh database `database_name`: the run with
    the median `key`, with every run's `key` (`<key>_all`) and their median (cpu_ms_median)."""
    runs = []
    for _ in range(repeat):
        with fresh_database(database_name):
            runs.append(measure())
    runs.sort(key=lambda r: r[key])
    result = runs[len(runs) // 2]
    result[f"{key}_all"] = [r[key] for r in runs]
    result["cpu_ms_median"] = statistics.median(result[f"{key}_all"])
    return result


def fill(nodes: int, gpus: int, jobs: int) -> None:
    from django.contrib.auth.models import User
    from django.utils import timezone

    from scheduler.models import Device, Job, Node, Queue, Task

    now = timezone.now()
    owner = User.objects.create_user("bench", password="bench-pass-123")
    queue = Queue.objects.get(name="default")
    Node.objects.bulk_create(
        Node(
            name=f"node-{i:04d}",
            cpu=64_000,
            memory=512 * GI,
            last_heartbeat=now,
            labels={"gpu-model": "h100"},
            token_hash=f"{i:064d}",
        )  # fmt: skip
        for i in range(nodes)
    )
    Device.objects.bulk_create(
        Device(node=node, index=d, uuid=f"{node.name}-gpu{d}", model="h100")
        for node in Node.objects.all()
        for d in range(gpus)
    )
    spec = {"queue": "default", "walltime": 3600, "tasks": [{
        "name": "main", "replicas": 1, "command": "python train.py", "env": {"LR": "0.1"},
        "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}, "node_selector": {},
    }]}  # fmt: skip
    created = Job.objects.bulk_create(
        Job(
            name=f"job-{i}",
            owner=owner,
            queue=queue,
            spec={**spec, "name": f"job-{i}"},
            walltime=3600,
        )  # fmt: skip
        for i in range(jobs)
    )
    Task.objects.bulk_create(
        Task(job=job, group="main", index=0, cpu=1000, memory=GI, gpu=1) for job in created
    )


def measure(meter: QueryMeter) -> dict[str, Any]:
    """One cycle through the loop, with per-phase figures from its report where it has them."""
    from django.db import connection
    from django.utils import timezone

    from scheduler.cycle.loop import run_scheduler_cycle
    from scheduler.models import Node

    Node.objects.update(last_heartbeat=timezone.now())  # the agents are alive, as in a cluster
    meter.queries, meter.seconds = 0, 0.0
    with connection.execute_wrapper(meter):
        start = time.perf_counter()
        report = run_scheduler_cycle()
        total = time.perf_counter() - start
    ms: dict[str, float] = dict.fromkeys(PHASES, 0.0)
    queries: dict[str, int] = {}
    phases = getattr(report, "phases", None)
    if phases is not None:
        for name, timing in phases.items():
            ms[name] = ms.get(name, 0.0) + timing.seconds * 1000
            queries[name] = queries.get(name, 0) + timing.queries
    else:  # an older loop: only wall times per phase, its publish untimed
        for name, seconds in report.durations.items():
            key = OLD_NAMES.get(name, name)
            ms[key] = ms.get(key, 0.0) + seconds * 1000
        ms["publish"] = max(0.0, total * 1000 - sum(ms.values()))
    ms["total"] = total * 1000
    return {
        "ms": {k: round(v, 1) for k, v in ms.items()},
        "db_phases_ms": round(sum(ms[p] for p in DB_PHASES), 1),
        "in_database_ms": round(meter.seconds * 1000, 1),
        "queries": {**queries, "total": meter.queries},
        "counts": {k: v for k, v in report.counts.items() if v},
        "errors": list(report.errors),
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process on this machine, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_idle(seconds: float, interval: float) -> dict[str, Any]:
    """Run the scheduler loop for `seconds` where nothing changes: CPU per second spent."""
    import threading

    from django.db import connection

    from scheduler.management.commands import run_scheduler

    reports: list[Any] = []
    real_cycle = run_scheduler._cycle_and_heartbeat

    def cycle(*args: Any, **kwargs: Any) -> Any:
        reports.append(real_cycle(*args, **kwargs))
        return reports[-1]

    class Lock:
        def try_acquire(self) -> bool:
            return True

        def still_held(self) -> bool:
            return True

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    done = threading.Event()
    stop = threading.Timer(seconds, done.set)
    run_scheduler._cycle_and_heartbeat = cycle  # type: ignore[assignment]
    cpu, pg, start = time.process_time(), _cpu_seconds(backend), time.perf_counter()
    try:
        stop.start()
        run_scheduler.run_loop(Lock(), interval, done, log_idle=False)  # type: ignore[arg-type]
    finally:
        run_scheduler._cycle_and_heartbeat = real_cycle  # type: ignore[assignment]
    wall = time.perf_counter() - start
    cpu, pg = time.process_time() - cpu, _cpu_seconds(backend) - pg
    skipped = sum(bool(getattr(r, "skipped", False)) for r in reports)
    return {
        "seconds": round(wall, 1),
        "cycles": len(reports),
        "skipped": skipped,
        "queries": sum(r.queries for r in reports),
        "scheduler_cpu_ms_per_s": round(cpu * 1000 / wall, 1),
        "postgres_cpu_ms_per_s": round(pg * 1000 / wall, 1),
    }


def count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError("must be between 1 and 1000000")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=count, default=200)
    parser.add_argument("--gpus", type=count, default=8, help="devices per node")
    parser.add_argument("--jobs", type=count, default=1000, help="pending one-GPU jobs")
    parser.add_argument("--steady", type=count, default=5, help="steady cycles (median shown)")
    parser.add_argument("--database-name", default="bench_cycle_db")
    parser.add_argument("--idle-seconds", type=float, default=0.0,
                        help="run the loop this long on the steady cluster (0: not)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=0.2, help="loop interval (s)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        parser.error("needs PostgreSQL: set DATABASE_URL=postgres://user@host:port/db")
    django.setup()
    from django.db import connection

    from scheduler.models import Allocation, Task
    from scheduler.states.names import TaskState

    meter = QueryMeter()
    result: dict[str, Any] = {"nodes": args.nodes, "gpus": args.gpus, "jobs": args.jobs}
    with fresh_database(args.database_name):
        measure(meter)  # warm up imports and the connection on an empty cluster
        fill(args.nodes, args.gpus, args.jobs)
        cycles: dict[str, Any] = {"place": measure(meter)}
        steady = [measure(meter) for _ in range(max(1, args.steady))]
        steady.sort(key=lambda c: c["ms"]["total"])
        cycles["steady"] = steady[len(steady) // 2]
        cycles["steady"]["total_ms_all"] = [c["ms"]["total"] for c in steady]
        Task.objects.filter(state=TaskState.ASSIGNED).update(state=TaskState.RUNNING)
        cycles["started"] = measure(meter)
        if args.idle_seconds > 0:
            measure(meter)  # the jobs' move to Running is written; now nothing changes
            result["idle"] = measure_idle(args.idle_seconds, args.interval)
        Allocation.objects.all().delete()
        Task.objects.filter(state=TaskState.RUNNING).update(state=TaskState.SUCCEEDED, exit_code=0)
        cycles["finished"] = measure(meter)
        result["cycles"] = cycles
        result["steady_total_ms_median"] = statistics.median(cycles["steady"]["total_ms_all"])
        connection.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
