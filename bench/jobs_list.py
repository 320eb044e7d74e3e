"""How fast the jobs page and API list stay with many jobs in the database.

    python bench/jobs_list.py --jobs 100000

Uses a database of its own (DATABASE_URL's server, database `berth_bench_jobs`), recreated
each run; creates the jobs in bulk, then times each request (median of --repeat) in ms.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BENCH_SECRET_KEY  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.repeat < 1:
        parser.error("--jobs and --repeat must be at least 1")
    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS berth_bench_jobs WITH (FORCE)")
        conn.execute("CREATE DATABASE berth_bench_jobs")
    env = {"DATABASE_URL": args.database.rsplit("/", 1)[0] + "/berth_bench_jobs",
           "BERTH_SECRET_KEY": BENCH_SECRET_KEY, "BERTH_ALLOWED_HOSTS": "testserver"}  # fmt: skip
    os.environ.update(env)
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
                   env={**os.environ}, check=True, cwd=ROOT)  # fmt: skip
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from scheduler.models import Job, Queue

    staff = User.objects.create_user("staff", is_staff=True)
    user = User.objects.create_user("user")
    queue = Queue.objects.get(name="default")
    states = ["Pending", "Running", "Succeeded", "Failed"]
    started = time.perf_counter()
    Job.objects.bulk_create(
        (Job(name=f"job-{i}", owner=staff if i % 10 else user, queue=queue, spec={},
             state=states[i % 4]) for i in range(args.jobs)),
        batch_size=5000,
    )  # fmt: skip
    fill = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_job")
    as_staff, as_user = Client(), Client()
    as_staff.force_login(staff)
    as_user.force_login(user)
    middle = Job.objects.order_by("id").values_list("id", flat=True)[args.jobs // 2]

    def median_ms(client: Any, url: str) -> float:
        times = []
        for _ in range(args.repeat):
            tick = time.perf_counter()
            assert client.get(url).status_code == 200, url
            times.append(time.perf_counter() - tick)
        return round(statistics.median(times) * 1000, 1)

    print(json.dumps({
        "jobs": args.jobs,
        "fill_seconds": round(fill, 1),
        "page_first_ms": median_ms(as_staff, "/jobs/"),
        "page_middle_ms": median_ms(as_staff, f"/jobs/?before={middle}"),
        "page_state_filter_ms": median_ms(as_staff, "/jobs/?state=Failed"),
        "page_search_ms": median_ms(as_staff, f"/jobs/?q=job-{args.jobs // 3}"),
        "page_own_jobs_ms": median_ms(as_user, "/jobs/"),
        "api_list_filtered_ms": median_ms(as_staff, "/api/v1/jobs/?state=Running"),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
