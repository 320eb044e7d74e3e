"""A node whose disk is nearly full says so instead of failing the tasks it is given.

The agent checks the free space of its work dir and its state dir (they may be different
volumes) once a second; below `min_free` bytes on either it reports `usage.pressure` with the
reason, the server then places no new task on the node (the node stays Ready for what it
runs: its tasks, output and lease go on) and the node page, `berth nodes` and the API show
why. A start order is checked against the disk as it is then, not as it was up to a second
ago: a task placed before the server heard of the pressure is refused at once (reported
Failed, naming it), and the report that says so carries the pressure, so the job's retry goes
to another node rather than fail here again. The pressure clears by itself once space is
free again, as the kubelet's DiskPressure condition does. Django-free: the node agent uses it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

DEFAULT_MIN_FREE = 256 * 2**20
CHECK_SECONDS = 1.0


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def disk_pressure(paths: Iterable[Path], min_free: int) -> str:
    """Why this node should take no new task ("" when it may): the first of `paths` whose
    volume has less than `min_free` bytes free to an unprivileged user, or cannot be read."""
    seen: set[int] = set()
    for path in paths:
        try:
            st = os.statvfs(path)
            device = os.stat(path).st_dev
        except OSError as exc:
            return f"disk: {path} unreadable ({exc.strerror})"
        if device in seen:
            continue
        seen.add(device)
        free = st.f_bavail * st.f_frsize
        if free < min_free:
            return f"disk full: {path} has {_mib(free)} free, under {_mib(min_free)}"
    return ""


class PressureWatch:
    """The node's pressure now, read at most once per CHECK_SECONDS."""

    def __init__(self, paths: list[Path], min_free: int = DEFAULT_MIN_FREE) -> None:
        self.paths, self.min_free = paths, min_free
        self.now = ""
        self._checked = float("-inf")

    def check(self, force: bool = False) -> bool:
        """Look again if due (`force`: now, whenever it last looked); True when the answer
        changed."""
        clock = time.monotonic()
        if not force and clock - self._checked < CHECK_SECONDS:
            return False
        self._checked = clock
        was, self.now = self.now, disk_pressure(self.paths, self.min_free)
        return was != self.now
