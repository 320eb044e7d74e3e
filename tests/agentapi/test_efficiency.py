"""What a job really used, shown as efficiency the way seff shows it: CPU time used over cores
asked x wall time, peak memory over memory asked; in the API, `berth show`, the job page and
/api/v1/usage/."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from django.utils import timezone

from berth.cli import main
from scheduler.models import Node, Task
from tests.agentapi.test_protocol import JOIN, _assigned, beat, lease, register

pytestmark = pytest.mark.django_db
MiB = 2**20


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def _ended(token: str, task: Any, cpu_seconds: float, peak: int) -> None:
    end = time.time()
    Task.objects.filter(pk=task.pk).update(assigned_at=timezone.now() - timedelta(seconds=20))
    lease(token, [{"id": task.pk, "attempt": 0, "state": "Running", "started_at": end - 10}])
    beat(token, [{"id": task.pk, "attempt": 0, "state": "Succeeded", "exit_code": 0,
                  "output_bytes": 0, "started_at": end - 10, "ended_at": end,
                  "usage": {"peak_memory": peak, "cpu_seconds": cpu_seconds}}])  # fmt: skip


@pytest.fixture
def two_jobs(owner):
    """A job that slept and one that spun, each asking for 1 core and 1 GiB for 10 s."""
    token = register().json()["token"]
    node = Node.objects.get()
    sleeper, sleeping = _assigned(owner, node, gpu=0, name="sleeper")
    spinner, spinning = _assigned(owner, node, gpu=0, name="spinner")
    _ended(token, sleeping, cpu_seconds=0.05, peak=8 * MiB)
    _ended(token, spinning, cpu_seconds=9.5, peak=512 * MiB)
    return sleeper, spinner


def test_the_api_shows_each_attempts_efficiency(two_jobs, owner, api):
    sleeper, spinner = two_jobs
    slept = api(owner).get(f"/api/v1/jobs/{sleeper.pk}/").json()["tasks"][0]["usage"]
    spun = api(owner).get(f"/api/v1/jobs/{spinner.pk}/").json()["tasks"][0]["usage"]
    assert (slept["cpu_percent"], spun["cpu_percent"]) == (0.5, 95.0)
    assert (slept["memory_percent"], spun["memory_percent"]) == (0.8, 50.0)
    assert spun["used_cpu_seconds"] == 9.5 and spun["peak_memory"] == 512 * MiB


def test_usage_sums_efficiency_per_group(two_jobs, owner, api):
    (row,) = api(owner).get("/api/v1/usage/").json()["results"]
    assert row["used_cpu_seconds"] == 9.55
    assert row["cpu_percent"] == round(100 * 9.55 / 20, 1)
    assert row["memory_percent"] == round(100 * 520 / 2048, 1)


def test_the_job_page_shows_efficiency(two_jobs, owner, client):
    client.force_login(owner)
    html = client.get(f"/jobs/{two_jobs[1].pk}/").content.decode()
    assert "CPU eff." in html and "95.0%" in html and "50.0%" in html


def test_berth_show_shows_efficiency(two_jobs, owner, api, monkeypatch):
    class Client:
        def get(self, path: str, **params: Any) -> dict[str, Any]:
            return api(owner).get(f"/api/v1/{path}").json()

    monkeypatch.setattr(main, "client", Client)
    out = CliRunner().invoke(main.cli, ["show", str(two_jobs[0].pk)]).output
    header, row = [line.split() for line in out.splitlines() if "main-0" in line or "TASK" in line]
    assert header[-3:] == ["CPU-EFF", "MEM-EFF", "PEAK"] and row[-3:] == ["0.5%", "0.8%",
                                                                          "8Mi/1Gi"]  # fmt: skip
