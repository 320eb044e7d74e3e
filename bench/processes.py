"""Processes that benchmarks and tests start (servers, schedulers, agents): a free port to
listen on, and their process groups stopped politely, then for good."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterable


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
