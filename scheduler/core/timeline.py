"""What one node has free over time: a step function from now on, for start estimates.

Segment i covers [times[i], times[i+1]) (the last one runs for ever) and has free[i] =
(cpu, memory, gpu) free then. Running tasks give back their resources at their ends; a job
planned into the future takes its share for its walltime (for ever without one).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from scheduler.core.resources import Resources

INF = math.inf
Free = tuple[int, int, int]


def as_free(resources: Resources) -> Free:
    return (resources.cpu, resources.memory, resources.gpu)


class Timeline:
    __slots__ = ("times", "free")

    def __init__(self, now: float, free: Free, releases: list[tuple[float, Free]]) -> None:
        """`releases`: (time, amount) given back at that time (INF: never)."""
        self.times: list[float] = [now]
        self.free: list[Free] = [free]
        cpu, memory, gpu = free
        for at, (c, m, g) in sorted(r for r in releases if r[0] < INF):
            cpu, memory, gpu = cpu + c, memory + m, gpu + g
            if at <= self.times[-1]:
                self.free[-1] = (cpu, memory, gpu)
            else:
                self.times.append(at)
                self.free.append((cpu, memory, gpu))

    def window(self, start: float, end: float) -> Free:
        """The least free in each dimension over [start, end)."""
        i = max(0, bisect_right(self.times, start) - 1)
        cpu, memory, gpu = self.free[i]
        i += 1
        while i < len(self.times) and self.times[i] < end:
            c, m, g = self.free[i]
            cpu, memory, gpu = min(cpu, c), min(memory, m), min(gpu, g)
            i += 1
        return (cpu, memory, gpu)

    def earliest(self, need: Free, duration: float, after: float, before: float) -> float | None:
        """The first time t in [after, before) from which `need` stays free for `duration`."""
        times, free = self.times, self.free
        last = len(times) - 1
        run: float | None = None  # where the current run of segments with room began
        for i in range(max(0, bisect_right(times, after) - 1), last + 1):
            if run is None and times[i] >= before:
                return None
            c, m, g = free[i]
            if c < need[0] or m < need[1] or g < need[2]:
                run = None
                continue
            if run is None:
                run = max(times[i], after)
                if run >= before:
                    return None
            if i == last or times[i + 1] >= run + duration:
                return run
        return None

    def hold(self, start: float, end: float, amount: Free) -> None:
        """Take `amount` over [start, end)."""
        self._split(start)
        if end < INF:
            self._split(end)
        c, m, g = amount
        i = bisect_right(self.times, start) - 1
        while i < len(self.times) and self.times[i] < end:
            cpu, memory, gpu = self.free[i]
            self.free[i] = (cpu - c, memory - m, gpu - g)
            i += 1

    def _split(self, at: float) -> None:
        i = bisect_right(self.times, at) - 1
        if i < 0:
            self.times.insert(0, at)
            self.free.insert(0, self.free[0])
        elif self.times[i] != at:
            self.times.insert(i + 1, at)
            self.free.insert(i + 1, self.free[i])
