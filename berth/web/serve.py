"""`./run serve`: the production web tier (see docs/serving.md for why this stack).

Checks the environment, applies migrations and collects static files, then replaces itself
with gunicorn running N uvicorn worker processes on one port. Each worker serves HTTP and
websockets (berth.asgi) with its own bounded database pool.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence

from uvicorn_worker import UvicornWorker

# Production needs all three: a database every process shares, a channel layer and cache
# every worker shares, and a key that signs sessions identically in every worker.
REQUIRED = {
    "DATABASE_URL": "a postgres://user@host:5432/db URL",
    "REDIS_URL": "a redis://host:6379/0 URL",
    "BERTH_SECRET_KEY": "at least 50 random characters",
}
# Workers per core by default. Django gives every ASGI request a thread of its own, so one
# process already overlaps its requests' database waits; more processes than cores only add
# connections and memory (measured in docs/serving.md).
WORKERS_PER_CORE = 1


class BerthUvicornWorker(UvicornWorker):
    """uvicorn inside gunicorn, without the lifespan protocol Django does not speak."""

    CONFIG_KWARGS = {"loop": "auto", "http": "auto", "lifespan": "off"}

    def load_wsgi(self) -> None:
        super().load_wsgi()
        open_database_pool()
        freeze_loaded_objects()


def open_database_pool() -> None:
    """Open this worker's pool now, so its connections exist from the start (Django would
    open it at the first request): the count at rest is then the count under load."""
    from django.db import connections

    pool = getattr(connections["default"], "pool", None)
    if pool is not None:
        pool.open(wait=False)


def freeze_loaded_objects() -> None:
    """Load every view now and move what the worker holds after loading out of the garbage
    collector's sight (`gc.freeze`). Those ~hundreds of thousands of objects (modules,
    classes, URL patterns, settings) live as long as the process, yet every full collection
    walked them all again: under load, a worker's full collections took 0.3-0.5 s each, with
    every request of the process stopped meanwhile (docs/benchmarks.md, "The web tier's
    tail"). Objects made afterwards are collected as before."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every urls and views module
    gc.collect()
    gc.freeze()


def settings_problems(environ: Mapping[str, str]) -> list[str]:
    problems = [
        f"{name} is not set: expected {what}"
        for name, what in REQUIRED.items()
        if not environ.get(name, "").strip()
    ]
    database_url = environ.get("DATABASE_URL", "").strip()
    if database_url and not database_url.startswith(("postgres://", "postgresql://")):
        problems.append(f"DATABASE_URL must be {REQUIRED['DATABASE_URL']} (SQLite: ./run up)")
    return problems


def default_workers() -> int:
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="./run serve",
        description="Serve Berth in production: HTTP and websockets, several worker processes"
        " on one port. Needs DATABASE_URL, REDIS_URL and BERTH_SECRET_KEY.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default %(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"worker processes (default {WORKERS_PER_CORE} per core: {default_workers()})",
    )
    parser.add_argument(
        "--no-migrate",
        action="store_true",
        help="skip `migrate` at start (when another step of the deployment runs it)",
    )
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = default_workers()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    return args


def prepare(migrate: bool) -> None:
    """Migrate and collect static files in this process, then let go of the database."""
    import django
    from django.core.management import call_command
    from django.db import connections

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
    django.setup()
    if migrate:
        call_command("migrate", interactive=False, verbosity=1)
    call_command("collectstatic", interactive=False, verbosity=0)
    for conn in connections.all():
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()


def prepare_metrics_dir() -> None:
    """/metrics must sum the HTTP counters of every worker, whichever one is scraped:
    prometheus_client's multiprocess mode keeps them in files in one directory, emptied at
    start so a previous run's workers are not counted again."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if not path:
        path = tempfile.mkdtemp(prefix="berth-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    os.makedirs(path, mode=0o700, exist_ok=True)
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))


def gunicorn_argv(args: argparse.Namespace) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "berth.asgi:application",
        "--worker-class",
        "berth.web.serve.BerthUvicornWorker",
        "--workers",
        str(args.workers),
        "--bind",
        f"{args.host}:{args.port}",
        # Client addresses from X-Forwarded-For only when the peer is this trusted proxy.
        "--forwarded-allow-ips",
        os.environ.get("BERTH_FORWARDED_ALLOW_IPS", "127.0.0.1"),
        "--graceful-timeout",
        "20",
        # Its default path is one per user: two servers on a host would fight over it.
        "--no-control-socket",
        "--config",
        "python:berth.web.gunicorn_hooks",
    ]
    access_log = os.environ.get("BERTH_ACCESS_LOG", "").strip()
    if access_log:  # off by default: one line per request costs throughput under load
        argv += ["--access-logfile", access_log]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problems = settings_problems(os.environ)
    if problems:
        for problem in problems:
            print(f"./run serve: {problem}", file=sys.stderr)
        print("see docs/configuration.md", file=sys.stderr)
        return 2
    prepare_metrics_dir()
    # Names this tier's connections in pg_stat_activity (the scheduler keeps "berth").
    os.environ.setdefault("BERTH_DB_APPLICATION_NAME", "berth-web")
    # Web workers keep their whole pool open: connections at rest = connections under load.
    pool_max = os.environ.get("BERTH_DB_POOL_MAX", "").strip() or "4"
    os.environ.setdefault("BERTH_DB_POOL_MIN", pool_max)
    from django.core.exceptions import ImproperlyConfigured

    from berth.env import ImproperlyConfiguredEnv

    try:
        prepare(migrate=not args.no_migrate)
    except (ImproperlyConfigured, ImproperlyConfiguredEnv) as exc:
        print(f"./run serve: {exc}", file=sys.stderr)
        return 2
    argv_ = gunicorn_argv(args)
    os.execv(argv_[0], argv_)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
