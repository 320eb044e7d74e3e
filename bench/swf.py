"""Read the Standard Workload Format (SWF 2.2, the Parallel Workloads Archive's format,
https://www.cs.huji.ac.il/labs/parallel/workload/swf.html), plain or gzipped.

- Header lines start with `;` (`; MaxNodes: 144`); `MaxNodes` and `MaxProcs` are kept: with
  both, a node has MaxProcs / MaxNodes processors (Blue Horizon: 1,152 / 144 = 8-way SMPs).
- A job is one line of 18 whitespace-separated numbers; -1 means unknown. Time fields may be
  fractional.
- What is replayed of a job (`trace_jobs`): its requested processors (the allocated ones when
  the request is unknown) as whole nodes (a gang of ceil(procs / per node) tasks, each one
  node), its requested time as the walltime (unknown: none) and its run time capped by that
  walltime (it would have been killed there).
- Jobs left out, counted by reason: cancelled (status 5) with a run time of 0 or -1 (they
  never ran: they held nothing), other jobs with no run time (-1), no processor count, wider
  than the machine.
- Hostile input is bounded: a line longer than `MAX_LINE` characters, a line without exactly
  18 fields, a field that is not a finite number or is out of range, is skipped and counted
  (`malformed`), never read whole into memory.
"""

from __future__ import annotations

import gzip
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

MAX_LINE = 1024  # characters: a job line is ~100
FIELDS = 18
LIMIT = 1e12  # seconds or processors: larger is not a real log
CANCELLED = 5
_HEADER = re.compile(r"^;\s*(MaxNodes|MaxProcs)\s*:\s*(\d{1,9})\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class SwfJob:
    id: int
    submit: float
    wait: float
    run: float
    alloc_procs: int
    req_procs: int
    req_time: float
    status: int
    user: int
    group: int
    queue: int


@dataclass
class SwfLog:
    max_nodes: int | None = None
    max_procs: int | None = None
    jobs: list[SwfJob] = field(default_factory=list)
    malformed: int = 0

    @property
    def procs_per_node(self) -> int:
        if self.max_nodes and self.max_procs and self.max_procs % self.max_nodes == 0:
            return self.max_procs // self.max_nodes
        return 1


def read(path: Path, limit: int | None = None) -> SwfLog:
    """The header and the first `limit` job lines (malformed ones do not count)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="ascii", errors="replace") as handle:
        return parse(handle, limit)


def parse(handle: IO[str], limit: int | None = None) -> SwfLog:
    log = SwfLog()
    for line in _lines(handle, log):
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            _header(log, text)
            continue
        if limit is not None and len(log.jobs) >= limit:
            break
        job = _job(text)
        if job is None:
            log.malformed += 1
        else:
            log.jobs.append(job)
    return log


def _lines(handle: IO[str], log: SwfLog) -> Iterator[str]:
    """Lines of at most MAX_LINE characters; a longer one is skipped (and counted) in
    pieces, never held whole."""
    while True:
        line = handle.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith("\n"):
            log.malformed += 1
            while line and not line.endswith("\n"):
                line = handle.readline(MAX_LINE + 1)
            continue
        yield line


def _header(log: SwfLog, text: str) -> None:
    match = _HEADER.match(text)
    if match is None:
        return
    key, value = match.group(1).lower(), int(match.group(2))
    if value <= 0:
        return
    if key == "maxnodes":
        log.max_nodes = value
    else:
        log.max_procs = value


def _job(text: str) -> SwfJob | None:
    parts = text.split()
    if len(parts) != FIELDS:
        return None
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    if any(not math.isfinite(v) or abs(v) > LIMIT for v in values):
        return None
    number, submit, wait, run, alloc, _cpu, _mem, req, req_time = values[:9]
    _req_mem, status, user, group, _app, queue = values[9:15]
    return SwfJob(
        id=int(number), submit=submit, wait=wait, run=run, alloc_procs=int(alloc),
        req_procs=int(req), req_time=req_time, status=int(status), user=int(user),
        group=int(group), queue=int(queue),
    )  # fmt: skip


@dataclass(frozen=True)
class Replayed:
    """A job as the replay takes it: a gang of `tasks` whole nodes."""

    job: SwfJob
    procs: int
    tasks: int
    walltime: float | None
    runtime: float


def replayed(log: SwfLog, nodes: int) -> tuple[list[Replayed], Counter[str]]:
    """The jobs to replay on `nodes` nodes of `log.procs_per_node` processors, and how many
    were left out for which reason."""
    per_node = log.procs_per_node
    kept: list[Replayed] = []
    left_out: Counter[str] = Counter()
    for job in log.jobs:
        reason = _left_out(job, nodes * per_node)
        if reason is not None:
            left_out[reason] += 1
            continue
        procs = job.req_procs if job.req_procs > 0 else job.alloc_procs
        walltime = job.req_time if job.req_time > 0 else None
        runtime = job.run if walltime is None else min(job.run, walltime)
        kept.append(Replayed(job, procs, -(-procs // per_node), walltime, runtime))
    return kept, left_out


def _left_out(job: SwfJob, machine_procs: int) -> str | None:
    if job.run <= 0 and job.status == CANCELLED:
        return "cancelled before it ran (status 5, run time 0 or -1)"
    if job.run < 0:
        return "no run time (-1)"
    procs = job.req_procs if job.req_procs > 0 else job.alloc_procs
    if procs <= 0:
        return "no processor count"
    if procs > machine_procs:
        return "wider than the machine"
    return None
