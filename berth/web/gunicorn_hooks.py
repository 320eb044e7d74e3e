"""gunicorn hooks of `./run serve` (loaded with `-c python:berth.web.gunicorn_hooks`)."""

from __future__ import annotations

from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    """A worker that exits leaves its counters summed in, and its gauges out, of /metrics."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
