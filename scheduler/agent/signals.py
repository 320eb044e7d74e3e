"""The node agent (and the server's long-running commands) stop cleanly on SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import threading
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
