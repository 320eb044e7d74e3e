"""Processes that benchmarks and tests start (servers, schedulers, agents): a free port to
listen on, a daphne server serving Berth, and their process groups stopped politely, then for
good."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_database_options(parser: argparse.ArgumentParser, database_name: str) -> None:
    """--database and --redis (where the bench's server connects: DATABASE_URL and REDIS_URL
    by default) and --database-name, the bench's own database."""
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--database-name", default=database_name,
                        help="the bench's own database, dropped and created again")  # fmt: skip


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_groups(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM every process group still running, wait up to `timeout` each, then SIGKILL."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until_serving(
    url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 30.0
) -> None:
    """Return once `url`'s sign-in page answers; RuntimeError with the server's log if `proc`
    exits first or nothing answers within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/accounts/login/", timeout=1)
            return
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(log_path.read_text()) from None
            time.sleep(0.2)


def start_daphne(
    port: int,
    env: Mapping[str, str],
    log_path: Path,
    *,
    access_log: Path | None = None,
    timeout: float = 30.0,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """Daphne serving Berth on 127.0.0.1:`port`, its output in `log_path` (added to it with
    `append`, for a server started again), returned once it answers HTTP; RuntimeError with
    its log if it exits or stays silent past `timeout`."""
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    if access_log is not None:
        command += ["--access-log", str(access_log)]
    with open(log_path, "ab" if append else "wb") as log:  # the server keeps its own descriptor
        proc = subprocess.Popen(
            [*command, "berth.asgi:application"],
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", proc, log_path, timeout)
    except RuntimeError:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return proc
