"""`./run serve` as a real process on PostgreSQL and Redis: many concurrent submissions
leave no 5xx and no extra connection behind; a starved pool answers 503 + Retry-After;
missing settings stop it with a message naming them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token

from bench.client import post_json
from bench.processes import free_port
from scheduler.models import Queue
from tests.e2e.conftest import database_url, wait_for

ROOT = Path(__file__).resolve().parents[2]
STRONG_KEY = "serve-test-key-" + "k3y" * 20
pytestmark = pytest.mark.postgres


@dataclass
class Server:
    url: str
    app_name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def connections(self, state: str | None = None) -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        params: list[str] = [self.app_name]
        if state:
            query += " AND wait_event_type = %s"
            params.append(state)
        with psycopg.connect(database_url(), autocommit=True) as conn:
            row = conn.execute(query, params).fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
def serve(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """serve(workers, **env) -> a running `./run serve` on the test database."""
    started: list[Server] = []
    # Transactional tests flush every table, the migration's default queue too.
    Queue.objects.get_or_create(name="default")

    def start(workers: int = 2, **extra_env: str) -> Server:
        port = free_port()
        app_name = f"berth-test-{uuid.uuid4().hex[:8]}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "BERTH_SECRET_KEY": STRONG_KEY,
            "BERTH_DATA_DIR": str(tmp_path / "data"),
            "BERTH_DB_APPLICATION_NAME": app_name,
            **extra_env,
        }
        env.pop("BERTH_TEST_DB_NAME", None)
        log = tmp_path / f"serve-{port}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(ROOT / "run"), "serve", "--port", str(port), "--workers", str(workers)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        server = Server(f"http://127.0.0.1:{port}", app_name, proc, log)
        started.append(server)

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_for(up, 60, "./run serve to listen")
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


@pytest.fixture
def token(owner: User) -> str:
    return Token.objects.create(user=owner).key


SPEC = {
    "name": "burst",
    "tasks": [{"name": "main", "command": "true", "resources": {"cpu": "0.5", "gpu": 1}}],
}


def test_it_serves_many_concurrent_submissions_and_keeps_its_connections(serve, token):
    workers, pool_max = 2, 3
    server = serve(workers, BERTH_DB_POOL_MAX=str(pool_max))
    # Every worker opens its whole pool at start: that is the server at rest.
    at_rest = wait_for(
        lambda: server.connections() == workers * pool_max and workers * pool_max,
        30,
        "the workers' pools to open",
    )
    headers = {"Authorization": f"Token {token}"}
    statuses: Counter[int] = Counter()

    def submit_many(_: int) -> None:
        # As every client should: a 503/429 is retried after its Retry-After (bounded), so
        # the only statuses left are what the server finally answered; a 500 never is retried.
        for _ in range(25):
            status, _body = post_json(f"{server.url}/api/v1/jobs/", SPEC, headers)
            statuses[status] += 1

    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server.connections())
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(submit_many, range(16)))
    done.set()
    watcher.join()

    assert statuses == {201: 16 * 25}
    assert peak <= at_rest
    assert server.connections() == at_rest
    status, body = post_json(f"{server.url}/api/v1/jobs/?page_size=1", None, headers, method="GET")
    assert status == 200 and body["count"] == 16 * 25

    # PostgreSQL drops every server connection (a restart, a failover): pooled connections
    # are checked as they are handed out, so no request fails and the pool refills.
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (server.app_name,),
        )
    for _ in range(2 * workers * pool_max):
        status, _body = post_json(f"{server.url}/api/v1/jobs/?page_size=1", None, headers, "GET", 0)
        assert status == 200
    wait_for(lambda: server.connections() == at_rest, 30, "the pools to refill")


def test_a_starved_pool_answers_503_with_retry_after_then_recovers(serve, token, owner):
    server = serve(1, BERTH_DB_POOL_MAX="1", BERTH_DB_POOL_TIMEOUT="0.5")
    wait_for(lambda: server.connections() == 1, 30, "the pool's one connection")
    headers = {"Authorization": f"Token {token}"}
    browser = Client()
    browser.force_login(owner)
    session = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    first: list[tuple[int, Any]] = []
    # A table lock makes the first request hold the pool's only connection while it waits.
    with psycopg.connect(database_url()) as locker:
        locker.execute("LOCK TABLE scheduler_job IN ACCESS EXCLUSIVE MODE")
        holder = threading.Thread(
            target=lambda: first.append(
                post_json(f"{server.url}/api/v1/jobs/", None, headers, method="GET")
            )
        )
        holder.start()
        wait_for(lambda: server.connections(state="Lock"), 30, "the first request to block")

        for path, request_headers in (("/api/v1/jobs/", headers), ("/jobs/", session)):
            status, body, retry_after = get_once(server.url + path, request_headers)
            assert (path, status) == (path, 503)
            assert retry_after == "1"
            assert "retry" in body["detail"]
        locker.rollback()
    holder.join(timeout=30)
    assert first and first[0][0] == 200
    assert get_once(f"{server.url}/api/v1/jobs/", headers)[0] == 200


def get_once(url: str, headers: dict[str, str]) -> tuple[int, Any, str | None]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            return response.status, json.loads(response.read() or b"null"), None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers.get("Retry-After")


@pytest.mark.parametrize("name", ["DATABASE_URL", "REDIS_URL", "BERTH_SECRET_KEY"])
def test_serve_refuses_to_start_without_a_required_setting(name):
    env = {
        **os.environ,
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x",
        "REDIS_URL": "redis://127.0.0.1:6379/9",
        "BERTH_SECRET_KEY": STRONG_KEY,
    }
    del env[name]
    result = subprocess.run(
        [str(ROOT / "run"), "serve", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"{name} is not set" in result.stderr


def test_serve_refuses_sqlite():
    env = {
        **os.environ,
        "DATABASE_URL": "sqlite:///tmp/x.sqlite3",
        "REDIS_URL": "redis://127.0.0.1:6379/9",
        "BERTH_SECRET_KEY": STRONG_KEY,
    }
    result = subprocess.run(
        [str(ROOT / "run"), "serve"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "DATABASE_URL must be a postgres://" in result.stderr


def test_serve_migrates_a_fresh_database_before_serving(serve):
    name = f"test_serve_fresh_{uuid.uuid4().hex[:8]}"
    base = database_url().rsplit("/", 1)[0]
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        server = serve(1, DATABASE_URL=f"{base}/{name}")
        with psycopg.connect(f"{base}/{name}", autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass('scheduler_job') IS NOT NULL").fetchone()
        assert row == (True,)
        assert get_once(f"{server.url}/api/v1/jobs/", {})[0] == 401  # served, and asks for auth
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(timeout=30)
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_metrics_count_the_requests_of_every_worker(serve, staff):
    from prometheus_client.parser import text_string_to_metric_families

    server = serve(4)
    headers = {"Authorization": f"Token {Token.objects.create(user=staff).key}"}
    for _ in range(40):  # a fresh connection each: the workers share them out
        status, _body = post_json(f"{server.url}/api/v1/me/", None, headers, "GET", 0)
        assert status == 200

    def served(family: str) -> float:
        status, text = post_json(f"{server.url}/metrics", None, headers, "GET", 0)
        assert status == 200, text
        return sum(
            sample.value
            for metric in text_string_to_metric_families(text)
            if metric.name == family
            for sample in metric.samples
            if sample.name == f"{family}_total"
            and sample.labels.get("status") == "200"
            and sample.labels.get("method") == "GET"
        )

    # Whichever worker answers the scrape, it reports all four workers' requests.
    assert served("berth_http_requests") >= 40
    assert served("berth_http_requests") >= 40
