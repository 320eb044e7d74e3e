"""/metrics: Prometheus text whose numbers match the cluster, readable only by staff and the
metrics token; HTTP metrics summed over worker processes in multiprocess mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from scheduler import lifecycle
from scheduler.cycle.liveness import record_cycle
from scheduler.models import Device, Queue, UsageRecord
from scheduler.ops.tokens import create_token
from scheduler.states.names import JobState, NodeState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _scrape(user) -> dict:
    client = Client()
    client.force_login(user)
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return _samples(response.content.decode())


def test_the_numbers_match_the_cluster(staff, owner):
    Queue.objects.create(name="research")
    gpu1 = make_node("gpu-01", gpus=4, cpu=16000)
    make_node("gpu-02", gpus=2, cpu=8000, state=NodeState.CORDONED)
    Device.objects.filter(node=gpu1, index=3).update(healthy=False)
    running = make_job(owner, "train", replicas=2, gpu=1, cpu=3000, queue="research")
    place(running, gpu1, devices=1)
    make_job(owner, "wait-1")
    make_job(owner, "wait-2", queue="research")
    done = make_job(owner, "quick")
    lifecycle.terminate_job(done, final_state=JobState.CANCELLED, reason="Cancelled", message="")
    record_cycle({"snapshot": 0.002, "schedule": 0.03}, 0.04, 1.0)
    record_cycle({"snapshot": 0.2, "schedule": 0.03}, 0.3, 1.0)

    m = _scrape(staff)
    assert m[("berth_jobs", (("queue", "default"), ("state", "Pending")))] == 1
    assert m[("berth_jobs", (("queue", "research"), ("state", "Running")))] == 1
    assert m[("berth_jobs", (("queue", "research"), ("state", "Pending")))] == 1
    assert m[("berth_jobs", (("queue", "default"), ("state", "Cancelled")))] == 1
    assert m[("berth_jobs", (("queue", "default"), ("state", "Succeeded")))] == 0
    assert m[("berth_jobs_finished_total", (("queue", "default"), ("state", "Cancelled")))] == 1
    assert m[("berth_nodes", (("state", "Ready"),))] == 1
    assert m[("berth_nodes", (("state", "Cordoned"),))] == 1
    # gpu-01: 2 held, 1 free, 1 unhealthy; gpu-02 is cordoned: its 2 are unavailable.
    assert m[("berth_gpus", (("state", "allocated"),))] == 2
    assert m[("berth_gpus", (("state", "free"),))] == 1
    assert m[("berth_gpus", (("state", "unavailable"),))] == 3
    assert m[("berth_cpu_millicores", (("state", "allocated"),))] == 6000
    assert m[("berth_cpu_millicores", (("state", "free"),))] == 10000
    assert m[("berth_cpu_millicores", (("state", "unavailable"),))] == 8000
    assert m[("berth_queue_pending_seconds", (("queue", "default"),))] > 0
    assert m[("berth_scheduler_last_cycle_timestamp_seconds", ())] > 1.7e9
    snapshot = (("phase", "snapshot"),)
    assert m[("berth_scheduler_cycle_seconds_count", snapshot)] == 2
    assert m[("berth_scheduler_cycle_seconds_sum", snapshot)] == pytest.approx(0.202)
    assert m[("berth_scheduler_cycle_seconds_bucket", (("le", "0.0025"), *snapshot))] == 1
    assert m[("berth_scheduler_cycle_seconds_bucket", (("le", "0.25"), *snapshot))] == 2
    assert m[("berth_scheduler_cycle_seconds_bucket", (("le", "+Inf"), *snapshot))] == 2


def test_http_requests_are_counted(staff):
    def gets() -> float:
        return _scrape(staff).get(
            ("berth_http_requests_total", (("method", "GET"), ("status", "200"))), 0.0
        )

    before = gets()
    client = Client()
    client.force_login(staff)
    for _ in range(3):
        assert client.get("/jobs/").status_code == 200
    # 3 page views and the scrape before this one.
    assert gets() == before + 4


def test_only_staff_and_the_metrics_token_may_read(owner, staff, settings):
    assert Client().get("/metrics").status_code == 401
    user = Client()
    user.force_login(owner)
    assert user.get("/metrics").status_code == 403
    _, staff_key = create_token(staff, "prometheus")
    _, owner_key = create_token(owner, "laptop")
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Token {staff_key}").status_code == 200
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {owner_key}").status_code == 403
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    settings.BERTH_METRICS_TOKEN = "scrape-secret-0123"
    ok = APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-0123")
    assert ok.status_code == 200 and b"berth_jobs" in ok.content
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret").status_code == 401


WORKER = """
import django, sys
django.setup()
from django.test import Client
for _ in range(int(sys.argv[1])):
    Client().get("/no-such-page/")
"""
SCRAPE = """
import django
django.setup()
from berth.web.metrics import http_metrics_text
print(http_metrics_text().decode())
"""


def test_worker_processes_are_summed_in_multiprocess_mode(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "berth.settings"}  # fmt: skip
    for count in ("2", "3"):
        subprocess.run([sys.executable, "-c", WORKER, count], env=env, cwd=ROOT, check=True)
    out = subprocess.run([sys.executable, "-c", SCRAPE], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    samples = _samples(out)
    total = sum(v for (name, _), v in samples.items() if name == "berth_http_requests_total")
    assert total == 5
    assert samples[("berth_http_request_duration_seconds_count", (("view", "unmatched"),))] == 5


def test_the_grafana_dashboard_uses_only_exported_metrics(staff):
    import json
    import re

    record_cycle({"load": 0.01}, 0.01, 1.0)
    Client().get("/healthz")  # HTTP metrics have samples once a request was answered
    now = timezone.now()  # usage counters have samples once a task attempt ended
    UsageRecord.objects.create(username="alice", queue="default", job_id=1, task_id=1,
                               state="Succeeded", started_at=now, finished_at=now, day=now.date(),
                               wall_seconds=1, cpu_seconds=1, gpu_seconds=1)  # fmt: skip
    exported = {name for name, _ in _scrape(staff)}
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"berth_[a-z_]+", target["expr"])}  # fmt: skip
    assert used and used <= exported, used - exported


def _http_total(method: str, status: str) -> float:
    from berth.web.metrics import http_metrics_text

    samples = _samples(http_metrics_text().decode())
    return samples.get(("berth_http_requests_total", (("method", method), ("status", status))), 0)


@pytest.mark.asyncio
async def test_requests_through_the_async_handler_are_counted_too():
    from django.test import AsyncClient

    before = _http_total("GET", "404")
    for _ in range(2):
        assert (await AsyncClient().get("/no-such-page/")).status_code == 404
    assert _http_total("GET", "404") == before + 2
