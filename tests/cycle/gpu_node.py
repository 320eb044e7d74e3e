"""What the GPU flow tests (GPU fractions, MIG) do through the server: register a GPU node as
its agent does, submit a one-task job asking for a GPU, a share of one or a MIG profile, and
run that job for an hour as its agent reports it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Task, UsageRecord
from tests.agentapi.test_protocol import JOIN, agent, register


def register_gpu_node(
    sharing: list[str], devices: list[dict[str, Any]], token: str = JOIN, scheme: str = "Bearer"
) -> str:
    """Register (or, with the node's own token and scheme "Node", register again) gpu-01;
    its node token."""
    body = {
        "name": "gpu-01",
        "cpu": "16",
        "memory": "64Gi",
        "gpu_sharing": sharing,
        "devices": devices,
    }
    response = register(body, token=token, scheme=scheme)
    assert response.status_code in (200, 201), response.content
    return str(response.json()["token"])


def submit_gpu_job(api: Any, owner: Any, gpu: Any, name: str) -> int:
    spec = {"name": name, "tasks": [{"name": "main", "command": "true",
            "resources": {"cpu": "0.5", "memory": "256Mi", "gpu": gpu}}]}  # fmt: skip
    response = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def run_for_an_hour(token: str, job_id: int) -> UsageRecord:
    """Place the one-task job, report it running and, an hour after its start, succeeded
    (its node's agent holds `token`); the usage record its end wrote."""
    run_scheduler_cycle()
    (task,) = Task.objects.filter(job_id=job_id)
    node = agent(token)
    running = [{"id": task.pk, "attempt": 0, "state": "Running"}]
    assert node.post("/api/v1/agent/report/", {"tasks": running}, format="json").status_code == 200
    Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(hours=1))
    ended = [{**running[0], "state": "Succeeded", "exit_code": 0, "output_bytes": 0}]
    assert node.post("/api/v1/agent/report/", {"tasks": ended}, format="json").status_code == 200
    (record,) = UsageRecord.objects.all()
    return record
