"""How fast a job array is accepted: one POST /api/v1/jobs/ with `array: "0-N"`.

    python bench/array_submit.py --elements 10000 [--replicas 1] [--repeat 3]

Uses a database of its own on DATABASE_URL's server (`berth_bench_arrays`, recreated each
run; PostgreSQL), posts the spec through Django's test client (the whole REST stack: parsing,
validation, the bulk inserts, the response) and prints JSON: elements/s and tasks/s of the
median run, with the time of each run in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DB_NAME = "berth_bench_arrays"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=1, help="tasks per element")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    if args.elements < 1 or args.replicas < 1 or args.repeat < 1:
        parser.error("--elements, --replicas and --repeat must be at least 1")
    if not args.database.startswith(("postgres://", "postgresql://")):
        parser.error("--database must be a PostgreSQL URL")
    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    os.environ.update({
        "DATABASE_URL": args.database.rsplit("/", 1)[0] + f"/{DB_NAME}",
        "BERTH_SECRET_KEY": "bench", "BERTH_ALLOWED_HOSTS": "testserver",
        "BERTH_ARRAY_MAX_ELEMENTS": str(max(args.elements, 100_000)),
        "BERTH_ARRAY_MAX_TASKS": str(max(args.elements * args.replicas, 200_000)),
    })  # fmt: skip
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
                   env={**os.environ}, check=True, cwd=ROOT)  # fmt: skip
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    from scheduler.models import Job, Task

    client = APIClient()
    client.force_authenticate(User.objects.create_user("bench"))
    spec = {
        "name": "sweep",
        "array": f"0-{args.elements - 1}",
        "walltime": 600,
        "tasks": [{"name": "main", "replicas": args.replicas,
                   "command": "python sweep.py --point $BERTH_ARRAY_INDEX",
                   "env": {"DATA": "/data/run"},
                   "resources": {"cpu": "1", "memory": "2Gi", "gpu": 0}}],
    }  # fmt: skip
    times = []
    for _ in range(args.repeat):
        tick = time.perf_counter()
        response = client.post("/api/v1/jobs/", spec, format="json")
        times.append(time.perf_counter() - tick)
        assert response.status_code == 201, response.content[:500]
        parent = response.json()["id"]
        assert Job.objects.filter(array_parent_id=parent).count() == args.elements
        assert Task.objects.filter(job__array_parent_id=parent).count() == (
            args.elements * args.replicas
        )
    median = statistics.median(times)
    print(
        json.dumps(
            {
                "elements": args.elements,
                "tasks_per_element": args.replicas,
                "database": "postgresql",
                "runs_ms": [round(t * 1000, 1) for t in times],
                "median_ms": round(median * 1000, 1),
                "elements_per_s": round(args.elements / median),
                "tasks_per_s": round(args.elements * args.replicas / median),
            }
        )
    )


if __name__ == "__main__":
    main()
