"""What the GPU flow tests (GPU fractions, MIG) do through the server: register a GPU node as
its agent does, and submit a one-task job asking for a GPU, a share of one or a MIG profile."""

from __future__ import annotations

from typing import Any

from tests.agentapi.test_protocol import JOIN, register


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
