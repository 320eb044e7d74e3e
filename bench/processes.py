"""Process groups started by benchmarks and tests (servers, schedulers, agents): stopped
politely, then for good."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable


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
