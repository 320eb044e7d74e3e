"""How cheap /healthz, /metrics and usage reports stay with many jobs and usage records.

    python bench/ops_endpoints.py --jobs 100000 --records 200000 --nodes 50

Uses a database of its own (DATABASE_URL's server, database `berth_bench_ops`), recreated each
run; fills jobs, nodes with 8 GPUs each, tasks on them and usage records over 60 days and 50
users in bulk, then times each request (median of --repeat) in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    if min(args.jobs, args.records, args.nodes, args.repeat) < 1:
        parser.error("--jobs, --records, --nodes and --repeat must be at least 1")
    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS berth_bench_ops WITH (FORCE)")
        conn.execute("CREATE DATABASE berth_bench_ops")
    os.environ.update({
        "DATABASE_URL": args.database.rsplit("/", 1)[0] + "/berth_bench_ops",
        "BERTH_SECRET_KEY": "bench", "BERTH_ALLOWED_HOSTS": "testserver",
    })  # fmt: skip
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
                   env={**os.environ}, check=True, cwd=ROOT)  # fmt: skip
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from scheduler.cycle.liveness import record_cycle
    from scheduler.models import Device, Job, Node, Queue, Task, UsageRecord

    staff = User.objects.create_user("staff", is_staff=True)
    users = [User.objects.create_user(f"user{i}") for i in range(50)]
    queue = Queue.objects.get(name="default")
    now = timezone.now()
    started = time.perf_counter()
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:03}", cpu=64000, memory=512 * 2**30, last_heartbeat=now)
        for i in range(args.nodes)
    )
    Device.objects.bulk_create(Device(node=n, index=g) for n in nodes for g in range(8))
    states = ["Pending", "Running", "Succeeded", "Failed"]
    jobs = Job.objects.bulk_create(
        (Job(name=f"job-{i}", owner=users[i % 50], queue=queue, spec={}, state=states[i % 4])
         for i in range(args.jobs)),
        batch_size=5000,
    )  # fmt: skip
    running = [j for j in jobs if j.state == "Running"][: args.nodes * 8]
    Task.objects.bulk_create(
        (Task(job=j, group="main", index=0, state="Running", node=nodes[k % args.nodes],
              cpu=4000, gpu=1) for k, j in enumerate(running)),
        batch_size=5000,
    )  # fmt: skip
    UsageRecord.objects.bulk_create(
        (UsageRecord(
            user=users[i % 50], username=users[i % 50].username, queue="default", job_id=i,
            task_id=i, state="Succeeded", started_at=now - timedelta(days=i % 60, hours=2),
            finished_at=now - timedelta(days=i % 60, hours=1), day=(now - timedelta(
                days=i % 60, hours=1)).date(), wall_seconds=3600, cpu_seconds=14400,
            gpu_seconds=3600) for i in range(args.records)),
        batch_size=5000,
    )  # fmt: skip
    fill = time.perf_counter() - started
    record_cycle({"snapshot": 0.01, "schedule": 0.02}, 0.03, 1.0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    client = Client()
    client.force_login(staff)

    def median_ms(url: str, status: int = 200) -> float:
        times = []
        for _ in range(args.repeat):
            tick = time.perf_counter()
            assert client.get(url).status_code == status, url
            times.append(time.perf_counter() - tick)
        return round(statistics.median(times) * 1000, 1)

    result: dict[str, Any] = {
        "jobs": args.jobs, "records": args.records, "nodes": args.nodes,
        "fill_seconds": round(fill, 1),
        "healthz_ms": median_ms("/healthz"),
        "metrics_ms": median_ms("/metrics"),
        "usage_api_30d_by_user_ms": median_ms("/api/v1/usage/?group_by=user"),
        "usage_api_30d_by_user_day_ms": median_ms("/api/v1/usage/?group_by=user,day"),
        "usage_page_30d_ms": median_ms("/usage/"),
    }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
