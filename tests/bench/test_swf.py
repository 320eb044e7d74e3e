"""bench/swf.py: the Standard Workload Format as the Parallel Workloads Archive writes it
(issue #21: the SDSC Blue Horizon log is replayed from its original SWF)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest

from bench import swf

HEADER = """; Version: 2.2
; Computer: IBM SP
; MaxNodes: 144
; MaxProcs: 1152
; Information: Each node is an 8-way SMP
;
"""


def line(number: int, run: str = "100", alloc: str = "8", req: str = "8", status: str = "1",
         req_time: str = "3600", user: str = "7") -> str:  # fmt: skip
    """One job line: the 18 fields, -1 where unknown."""
    return (
        f"{number} {number * 10} 5 {run} {alloc} -1 -1 {req} {req_time} -1 {status} {user}"
        " 3 -1 2 -1 -1 -1\n"
    )


def test_it_reads_the_header_and_the_jobs_skipping_comments_and_blank_lines():
    text = HEADER + line(1) + "\n; a comment between jobs\n" + line(2, run="50.5")
    log = swf.parse(io.StringIO(text))
    assert (log.max_nodes, log.max_procs, log.procs_per_node) == (144, 1152, 8)
    assert [j.id for j in log.jobs] == [1, 2]
    first = log.jobs[0]
    assert (first.submit, first.wait, first.run, first.req_procs, first.req_time) == (
        10.0, 5.0, 100.0, 8, 3600.0,
    )  # fmt: skip
    assert (first.status, first.user, first.group, first.queue) == (1, 7, 3, 2)
    assert log.jobs[1].run == 50.5  # time fields may be fractional
    assert log.malformed == 0


def test_without_a_node_count_every_processor_is_a_node():
    assert swf.parse(io.StringIO("; MaxProcs: 100\n" + line(1))).procs_per_node == 1
    assert swf.parse(io.StringIO("; MaxNodes: 7\n; MaxProcs: 100\n")).procs_per_node == 1


def test_jobs_are_replayed_as_gangs_of_whole_nodes_with_run_times_capped_by_the_walltime():
    log = swf.parse(io.StringIO(HEADER + line(1, req="64") + line(2, req="12", run="9000")))
    kept, left_out = swf.replayed(log, 144)
    assert [(r.procs, r.tasks) for r in kept] == [(64, 8), (12, 2)]  # 12 procs: 2 nodes
    assert [r.runtime for r in kept] == [100.0, 3600.0]  # killed at its walltime
    assert left_out == {}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"status": "5", "run": "0", "alloc": "-1"}, "cancelled before it ran"),
        ({"status": "5", "run": "-1", "alloc": "-1"}, "cancelled before it ran"),
        ({"run": "-1"}, "no run time"),
        ({"req": "-1", "alloc": "-1"}, "no processor count"),
        ({"req": "2000"}, "wider than the machine"),
    ],
)
def test_jobs_that_never_ran_or_cannot_be_replayed_are_left_out_and_counted(fields, reason):
    log = swf.parse(io.StringIO(HEADER + line(1, **fields)))
    kept, left_out = swf.replayed(log, 144)
    assert kept == []
    assert [k for k in left_out if k.startswith(reason)] and sum(left_out.values()) == 1


def test_a_cancelled_job_that_ran_and_a_job_of_no_time_are_replayed():
    """Status 5 with a run time: it held its processors until cancelled. A run time of 0
    on a completed job means under half a second (the SWF spec), not unknown."""
    text = HEADER + line(1, status="5", run="63", alloc="-1") + line(2, run="0")
    kept, _ = swf.replayed(swf.parse(io.StringIO(text)), 144)
    assert [(r.job.id, r.runtime) for r in kept] == [(1, 63.0), (2, 0.0)]


def test_unknown_requests_fall_back_as_the_spec_allows():
    text = HEADER + line(1, req="-1", alloc="16", req_time="-1")
    (kept,), _ = swf.replayed(swf.parse(io.StringIO(text)), 144)
    assert (kept.procs, kept.tasks, kept.walltime, kept.runtime) == (16, 2, None, 100.0)


@pytest.mark.parametrize(
    "bad",
    [
        "1 2 3\n",  # too few fields
        line(1).strip() + " 9\n",  # too many
        line(1).replace("100", "1e400", 1),  # not finite
        line(1).replace("100", "nan", 1),
        line(1).replace("100", "1e13", 1),  # out of range
        line(1).replace("100", "ten", 1),
        "x" * (swf.MAX_LINE * 50) + "\n",  # far too long: skipped in pieces
        "1 " * 5000 + "\n",
    ],
)
def test_hostile_lines_are_skipped_and_counted(bad):
    log = swf.parse(io.StringIO(HEADER + bad + line(2)))
    assert [j.id for j in log.jobs] == [2]
    assert log.malformed == 1


def test_an_overlong_last_line_without_a_newline_ends_the_log():
    log = swf.parse(io.StringIO(HEADER + line(1) + "9" * (swf.MAX_LINE + 10)))
    assert [j.id for j in log.jobs] == [1]
    assert log.malformed == 1


def test_an_overlong_header_line_is_skipped_not_believed():
    text = "; MaxNodes: 144" + " " * swf.MAX_LINE + "\n; MaxProcs: 1152\n" + line(1)
    log = swf.parse(io.StringIO(text))
    assert (log.max_nodes, log.procs_per_node) == (None, 1)


def test_a_limit_counts_jobs_and_gzip_is_read(tmp_path: Path):
    path = tmp_path / "log.swf.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(HEADER + "".join(line(i) for i in range(1, 6)))
    log = swf.read(path, limit=3)
    assert [j.id for j in log.jobs] == [1, 2, 3]
    assert log.max_nodes == 144
