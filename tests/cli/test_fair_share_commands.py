"""`berth submit` past a per-user pending limit, `berth show`'s priority factors (as sprio)
and `berth usage --shares` (as sshare), against the real REST API (the CLI's HTTP client is
wired straight into the Django app, no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Job, Queue
from tests.factories import make_node, make_usage

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_fair_share")]


def test_submit_past_the_pending_limit_names_it_and_writes_nothing(berth: Any, owner: Any) -> None:
    Queue.objects.update_or_create(name="default", defaults={"max_user_pending_jobs": 2})
    assert berth("submit", "--", "true").exit_code == 0
    refused = berth("submit", "--array", "0-1", "--", "true")
    assert refused.exit_code == 1
    assert "max_user_pending_jobs" in refused.output and "adds 2" in refused.output
    assert berth("submit", "--", "true").exit_code == 0
    again = berth("submit", "--", "true")
    assert again.exit_code == 1 and "you have 2 pending" in again.output
    assert Job.objects.filter(owner=owner).count() == 2


def test_show_prints_a_waiting_jobs_factors(berth: Any, owner: Any) -> None:
    make_node("gpu-1", gpus=1, cpu=8000)
    assert berth("submit", "--gpus", "1", "--", "true").exit_code == 0
    submitted = berth("submit", "--gpus", "1", "--json", "--", "true")
    job_id = json.loads(submitted.output)["id"]
    run_scheduler_cycle()  # the first takes the GPU; this one waits
    out = berth("show", str(job_id)).output
    assert "sched prio" in out
    assert "fair_share" in out and "(factor 1.0)" in out


def test_usage_shares_prints_each_users_share_and_factor(berth: Any, owner: Any) -> None:
    make_usage(owner, gpu_seconds=3600.0)
    result = berth("usage", "--shares")
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()[:2]
    assert header.split() == ["USER", "SHARES", "NORM-SHARES", "USAGE", "NORM-USAGE", "FAIRSHARE"]
    assert row.split()[0] == "alice" and row.split()[-1] == "0.5000"
