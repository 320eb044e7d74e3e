"""Run the scheduler's loop (run_scheduler.run_loop) as the leader, with a stand-in for each
cycle: the loop tests see which cycles it asks for, and with which flags."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest


class HeldLock:
    """A leader lock that is always held."""

    def try_acquire(self) -> bool:
        return True

    def still_held(self) -> bool:
        return True


def run_loop(
    monkeypatch: pytest.MonkeyPatch,
    cycle: Callable[[float, bool, bool], object],
    interval: float,
    stop: threading.Event,
) -> None:
    """Run the loop every `interval` seconds until `stop` is set, `cycle(interval,
    housekeeping, skip_unchanged)` standing in for each cycle and its heartbeat."""
    from scheduler.management.commands import run_scheduler

    monkeypatch.setattr(run_scheduler, "_cycle_and_heartbeat", cycle)
    run_scheduler.run_loop(HeldLock(), interval, stop)  # type: ignore[arg-type]
