"""Long-running commands stop cleanly on SIGTERM or Ctrl-C, and what `./run up` runs in its
threads is started again when it fails."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("berth")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: the command finishes its unit of work and exits."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping after the current unit of work", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def supervise(name: str, work: Callable[[threading.Event], None], stop: threading.Event,
              first_wait: float = 1.0, cap: float = 30.0) -> None:  # fmt: skip
    """Run `work(stop)` until `stop` is set, starting it again whenever it returns or raises
    before that (logged, then after a wait that doubles up to `cap`): what `./run up` runs
    in its threads outlives any one failure, as systemd's Restart=always does for a unit."""
    wait = first_wait
    while not stop.is_set():
        started = time.monotonic()
        try:
            work(stop)
        except Exception:  # noqa: BLE001 - logged; the supervisor starts it again
            log.exception("%s stopped with an error", name)
        else:
            if stop.is_set():
                return
            log.error("%s stopped by itself", name)
        if time.monotonic() - started > 10 * cap:
            wait = first_wait  # it ran well for a long while: this is a new failure
        log.warning("starting %s again in %.1fs", name, wait)
        stop.wait(wait)
        wait = min(cap, wait * 2)
