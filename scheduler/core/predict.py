"""Runtime predictions (EASY++: Tsafrir, Etsion & Feitelson, "Backfilling using
system-generated predictions rather than user runtime estimates", IEEE TPDS 18(6), 2007).

1. A job's prediction is the mean run time of its owner's last two finished jobs (of the one,
   if there is only one), capped by the job's walltime; an owner with no history gets the
   walltime. A job without a walltime has no prediction (it has no end to plan either).
2. The prediction stands in for the walltime wherever the core plans an end: a running
   task's end for the backfill reservation and the start estimates, and a backfill
   candidate's end ("does it end before the reservation starts?").
3. A job that outlives its prediction gets a larger one (`raised`): the walltime (the
   paper's "user estimate" correction), or the next of the paper's steps above what it has
   run (1 min, 5 min, 15 min, 30 min, 1 h, 2 h, 5 h, 10 h, 20 h, 50 h, 100 h), capped by the
   walltime.
4. Jobs are still killed at their walltime only: nothing here ends a job.

Pure (no Django): the server and the replay feed each job's prediction (`JobInfo.predicted`)
from the owners' histories (`History`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Protocol

CORRECTIONS = ("walltime", "stepwise")
STEPS = (60, 300, 900, 1800, 3600, 7200, 18000, 36000, 72000, 180000, 360000)
HISTORY = 2  # finished jobs per owner the prediction averages


class Predicted(Protocol):
    walltime: float | None
    predicted: float | None


def predict(history: Sequence[float], walltime: float | None) -> float | None:
    """The prediction for a new job: the mean of the owner's last `HISTORY` run times
    (oldest first in `history`), capped by the walltime; the walltime without history."""
    if walltime is None:
        return None
    recent = history[-HISTORY:]
    if not recent:
        return walltime
    return min(walltime, sum(recent) / len(recent))


def raised(prediction: float, elapsed: float, walltime: float, correction: str) -> float:
    """The prediction of a job that has run `elapsed` seconds: as it was while the job has
    not reached it; once outlived, the walltime, or the first step above `elapsed`."""
    if elapsed < prediction or prediction >= walltime:
        return prediction
    if correction == "walltime":
        return walltime
    i = bisect_right(STEPS, elapsed)
    return float(min(walltime, STEPS[i])) if i < len(STEPS) else walltime


def runtime(job: Predicted) -> float | None:
    """How long the core plans for a job that has not started: its prediction if it has
    one, else its walltime (None: no end)."""
    walltime = job.walltime
    if job.predicted is None or walltime is None:
        return walltime
    return min(job.predicted, walltime)


def end(job: Predicted, started_at: float, now: float, correction: str) -> float | None:
    """When the core expects a task of the job started at `started_at` to end, seen at
    `now`: its start plus its walltime, or plus its prediction raised as often as it has
    been outlived (so never at or before `now` while the walltime has not passed)."""
    walltime = job.walltime
    if walltime is None:
        return None
    if job.predicted is None:
        return started_at + walltime
    prediction = min(job.predicted, walltime)
    while True:
        higher = raised(prediction, now - started_at, walltime, correction)
        if higher == prediction:
            return started_at + prediction
        prediction = higher


class History:
    """Each owner's last `HISTORY` finished run times, oldest first (the replay's and a
    test's source; the server reads the same from its database)."""

    def __init__(self) -> None:
        self.runs: dict[str, deque[float]] = {}

    def finished(self, owner: str, ran: float) -> None:
        runs = self.runs.get(owner)
        if runs is None:
            runs = self.runs[owner] = deque(maxlen=HISTORY)
        runs.append(ran)

    def predict(self, owner: str, walltime: float | None) -> float | None:
        return predict(tuple(self.runs.get(owner, ())), walltime)
