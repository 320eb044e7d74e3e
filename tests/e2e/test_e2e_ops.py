"""End to end with real processes: /healthz follows the scheduler process, and a job run by a
real agent shows up in usage and in /metrics, whichever process wrote each part."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.models import Job, Task
from scheduler.ops.tokens import create_token
from scheduler.states.names import JobState
from tests.e2e.conftest import Cluster, wait_for
from tests.e2e.test_e2e_jobs import one_task, submit

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Token {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _health(url: str) -> tuple[int, dict[str, Any]]:
    status, body = _get(f"{url}/healthz")
    return status, json.loads(body)


def test_healthz_turns_503_when_the_scheduler_stops(cluster: Cluster):
    scheduler = cluster.scheduler(interval=0.2)
    wait_for(lambda: _health(cluster.url)[0] == 200, what="healthz 200 with the scheduler up")
    os.killpg(scheduler.pid, signal.SIGTERM)
    scheduler.wait(timeout=10)
    # 5 intervals of 0.2 s without a cycle.
    status, body = wait_for(lambda: (h := _health(cluster.url))[0] == 503 and h,
                            what="healthz 503 after the scheduler stopped")  # fmt: skip
    assert body["scheduler"].startswith("no cycle for")
    assert body["database"] == body["channel_layer"] == "ok"


def test_a_real_job_is_accounted_and_counted(cluster: Cluster, api, owner, staff):
    cluster.agent("e2e-ops")
    cluster.scheduler()
    job_id = submit(
        api(owner), one_task("acct", "sleep 1", resources={"cpu": "0.5", "memory": "16Mi"})
    )
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED, what="job done")
    task = Task.objects.get(job_id=job_id)
    assert task.finished_at is not None and task.started_at is not None
    measured = (task.finished_at - task.started_at).total_seconds()
    assert measured > 0  # as the server saw it: from the agent's start report to its end

    _, alice_key = create_token(owner, "e2e")
    status, body = _get(f"{cluster.url}/api/v1/usage/?group_by=user,queue", alice_key)
    assert status == 200, body
    (row,) = json.loads(body)["results"]
    assert (row["user"], row["queue"], row["jobs"], row["tasks"]) == ("alice", "default", 1, 1)
    assert row["wall_seconds"] == pytest.approx(measured, abs=0.001)
    assert row["cpu_seconds"] == pytest.approx(0.5 * measured, abs=0.001)

    _, staff_key = create_token(staff, "prometheus")
    assert _get(f"{cluster.url}/metrics", alice_key)[0] == 403
    status, text = _get(f"{cluster.url}/metrics", staff_key)
    assert status == 200
    families = text_string_to_metric_families(text.decode())
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families for s in f.samples}  # fmt: skip
    finished = ("berth_jobs_finished_total", (("queue", "default"), ("state", "Succeeded")))
    assert samples[finished] == 1
    assert samples[("berth_scheduler_cycle_seconds_count", (("phase", "total"),))] >= 1
    assert samples[("berth_jobs", (("queue", "default"), ("state", "Succeeded")))] == 1
