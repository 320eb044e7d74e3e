"""What `./run up` runs in its threads is started again when it fails; long-running commands
stop cleanly on SIGTERM or Ctrl-C (`stop_on_signals`, which the node agent shares: it lives in
its package, which imports nothing of the server)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.agent.signals import stop_on_signals as stop_on_signals

log = logging.getLogger("berth")


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
