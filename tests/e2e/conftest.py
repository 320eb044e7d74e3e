"""A real cluster for end-to-end tests: a live server, `run_scheduler` and `run_agent` as
separate processes on the PostgreSQL test database, jobs submitted over REST."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from bench.processes import stop_groups
from scheduler.models import Queue

ROOT = Path(__file__).resolve().parents[2]
JOIN_TOKEN = "e2e-join-token"


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def database_url() -> str:
    """The test database as a URL, for the processes a test starts (server, loop, agents)."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def skip_unless_shared_stack(database_why: str, redis_why: str) -> None:
    """Skip a test whose processes share this test run's database and channel layer where
    either is missing: PostgreSQL (not SQLite) and Redis (not the in-memory layer)."""
    from django.conf import settings

    if connection.vendor != "postgresql":
        pytest.skip(f"needs PostgreSQL: {database_why}")
    if "channels_redis" not in str(settings.CHANNEL_LAYERS["default"]["BACKEND"]):
        pytest.skip(f"needs Redis (REDIS_URL): {redis_why}")


@dataclass
class Cluster:
    url: str
    env: dict[str, str]
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def scheduler(self, name: str = "scheduler", interval: float = 0.2) -> subprocess.Popen[bytes]:
        return self._start(name, "run_scheduler", "--interval", str(interval))

    def agent(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        work = self.tmp / f"agent-{name}"
        return self._start(
            f"agent-{name}",
            "run_agent",
            "--server",
            self.url,
            "--name",
            name,
            "--work-dir",
            str(work),
            "--state-dir",
            str(work / "state"),
            *extra,
        )

    def simagent(self, *args: str) -> subprocess.Popen[bytes]:
        return self._start("simagent", "run_simagent", "--server", self.url, *args)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        stop_groups(self.procs)


@pytest.fixture
def cluster(
    transactional_db: None, live_server: Any, settings: Any, tmp_path: Path
) -> Iterator[Cluster]:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the agents and the scheduler share the test database")
    if not os.environ.get("REDIS_URL", "").strip():
        # run_scheduler refuses to loop on the in-memory layer: its orders would not leave it.
        pytest.skip("needs Redis (REDIS_URL): run_scheduler wakes the agents' leases through it")
    # Transactional tests flush every table, the migration's default queue too.
    Queue.objects.get_or_create(name="default")
    settings.BERTH_JOIN_TOKEN = JOIN_TOKEN
    # Leases of a second: orders still reach the agents at once, woken through Redis by
    # the scheduler's process; a dead node is noticed within BERTH_HEARTBEAT_TIMEOUT.
    settings.BERTH_HEARTBEAT_INTERVAL = 1.0
    settings.BERTH_HEARTBEAT_TIMEOUT = 6.0
    settings.BERTH_KILL_GRACE_SECONDS = 1.0
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        # Long enough for DEBUG-off settings, which refuse short keys; public: tests only.
        "BERTH_SECRET_KEY": "e2e-tests-only-secret-key-never-in-production-0123456789",
        "BERTH_JOIN_TOKEN": JOIN_TOKEN,  # agents read it here, never from their command line
        "BERTH_SCHEDULER_INTERVAL": "0.2",
        "BERTH_HEARTBEAT_INTERVAL": "1",
        "BERTH_HEARTBEAT_TIMEOUT": "6",
        "BERTH_KILL_GRACE_SECONDS": "1",
        "BERTH_DATA_DIR": str(tmp_path / "data"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("BERTH_TEST_DB_NAME", None)
    c = Cluster(url=live_server.url, env=env, tmp=tmp_path)
    try:
        yield c
    finally:
        c.stop()
        # Let the live server's threads finish before the test database is flushed.
        time.sleep(0.2)


@pytest.fixture
def token(owner: Any) -> str:
    return Token.objects.create(user=owner).key
