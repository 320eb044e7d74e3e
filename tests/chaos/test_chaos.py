"""The chaos suite's short cases: each fault of bench/chaos.py, made for real under a light
load in the production layout (a private PostgreSQL and Redis, `./run serve`, two
`run_scheduler`, simulated nodes, real agents where the fault is on a node), with the same
checks: no 5xx but deliberate 503s, nothing lost, nothing run twice, every process alive,
/healthz back to 200. docs/operations.md's table "What happens when X fails" is this file,
line by line; docs/benchmarks.md has the long runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench.chaos import parse_args, run_fault
from bench.faults import missing_parts

# They need PostgreSQL's server programs and redis-server: a skip is a failure in CI.
pytestmark = [pytest.mark.postgres, pytest.mark.chaos]


@pytest.fixture(autouse=True)
def _parts() -> None:
    missing = missing_parts()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian's postgresql and redis-server)")


def short(**overrides: Any) -> argparse.Namespace:
    args = parse_args(["--outage", "8", "--rate", "3", "--clients", "2", "--nodes", "2",
                       "--warmup", "2", "--settle", "2", "--job-seconds", "15"])  # fmt: skip
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def assert_steady(result: dict[str, Any], healthz_within: float = 30.0) -> None:
    """The steady state holds after the fault: what every experiment checks."""
    # Each check names its field first: pytest cuts a long result short.
    assert result["steady_before"], ("steady_before", result)
    assert result["accepted"] > 0, ("accepted", result)
    assert result["bad_5xx"] == 0, ("bad_5xx", result["answers"])
    assert result["client_errors"] == [], ("client_errors", result)
    assert result["lost"] == 0, ("lost", result)
    assert result["not_final"] == 0, ("not_final", result)
    assert result["written_despite_503"] == 0, ("written_despite_503", result)
    assert result["doubled_usage_records"] == 0, ("doubled_usage_records", result)
    assert result["overlapping_attempts"] == 0, ("overlapping_attempts", result)
    assert result["alive"], ("alive", result["processes"])
    assert result["healthz_back_s"] is not None and result["healthz_back_s"] <= healthz_within
    assert result["drained_s"] is not None, result


def test_a_postgresql_restart_under_load_loses_nothing_and_the_scheduler_lives(tmp_path: Path):
    # The outage of issue #20: PostgreSQL stopped for 3 s and started again while four
    # clients submit; run_scheduler used to die of it, leaving every job where it was.
    result = run_fault("pg-restart", short(restart_seconds=3.0), tmp_path)
    assert_steady(result)


def test_a_database_down_for_a_while_is_a_503_naming_it_then_business_as_usual(tmp_path: Path):
    result = run_fault("pg-down", short(), tmp_path)
    assert_steady(result)
    assert result["answered_503"] > 0  # submissions while it was down were refused, not lost
    assert result["healthz_while_down"]["status"] == 503
    assert result["healthz_while_down"]["database"] == "unreachable"


def test_a_redis_outage_is_survived_and_healthz_names_it(tmp_path: Path):
    result = run_fault("redis-down", short(), tmp_path)
    assert_steady(result)
    assert result["healthz_while_down"]["channel_layer"] == "unreachable"
    assert result["healthz_while_down"]["database"] == "ok"


def test_a_frozen_leader_is_replaced_and_stands_down_when_it_wakes(tmp_path: Path):
    result = run_fault("leader-freeze", short(outage=10.0), tmp_path)
    assert_steady(result)
    assert result["standby_took_over_s"] is not None  # within BERTH_LEADER_TIMEOUT (4 s)
    assert result["woken_leader_stood_down_s"] is not None


def test_an_agent_with_its_clock_an_hour_ahead_is_accounted_by_the_servers_clock(
    tmp_path: Path,
):  # fmt: skip
    result = run_fault("clock-skew", short(), tmp_path)
    assert_steady(result)
    assert result["skewed_jobs_succeeded_s"] is not None
    assert 0.9 < result["wall_seconds_min"] <= result["wall_seconds_max"] < 10  # not 3600


@pytest.mark.root
def test_a_cut_off_agent_stops_its_task_before_it_runs_elsewhere(tmp_path: Path):
    result = run_fault("partition", short(outage=12.0), tmp_path)
    assert_steady(result)
    assert result["cut_agent_fenced"]
    assert result["moved_after_s"] is not None  # the server gave the node up, retried it
    assert result["ran_twice_at_once"] == 0  # and the cut agent had stopped it by then
    assert result["guarded_job"] == "Succeeded"
    assert result["cut_agent_rejoined_s"] is not None


@pytest.mark.root
def test_a_node_whose_disk_fills_takes_no_task_and_says_why(tmp_path: Path):
    result = run_fault("node-disk-full", short(), tmp_path)
    assert_steady(result)
    assert "disk full" in result["pressure"]
    assert result["job_ran_on"] == "roomy"
    assert result["pressure_cleared_s"] is not None
    assert result["agent_survived"]


@pytest.mark.root
def test_a_full_database_disk_refuses_new_work_with_a_clear_503(tmp_path: Path):
    result = run_fault("db-disk-full", short(), tmp_path)
    assert_steady(result)
    refused = result["submit_while_full"]
    assert refused["status"] == 503 and refused["retry_after"]
    assert "disk full" in refused["detail"]
