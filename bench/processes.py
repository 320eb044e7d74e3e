"""Processes that benchmarks and tests start (servers, schedulers, agents): a free port to
listen on, a daphne server serving Berth, and their process groups stopped politely, then for
good."""

from __future__ import annotations

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


def start_daphne(
    port: int,
    env: Mapping[str, str],
    log_path: Path,
    *,
    access_log: Path | None = None,
    timeout: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Daphne serving Berth on 127.0.0.1:`port`, its output in `log_path`, returned once it
    answers HTTP; RuntimeError with its log if it exits or stays silent past `timeout`."""
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    if access_log is not None:
        command += ["--access-log", str(access_log)]
    with open(log_path, "wb") as log:  # the server keeps its own descriptor
        proc = subprocess.Popen(
            [*command, "berth.asgi:application"],
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=1)
            return proc
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.terminate()
                proc.wait(timeout=10)
                raise RuntimeError(log_path.read_text()) from None
            time.sleep(0.2)
