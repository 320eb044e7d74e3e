"""`berth nodes` says what each node enforces on its tasks, and why a node runs nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main

NODES = [
    {"name": "gpu-01", "state": "Ready", "cpu": "8", "memory": "64Gi", "devices": [],
     "labels": {}, "enforcement": {"mode": "required", "cgroup": "v1", "problem": "",
                                   "enforced": ["cpu", "memory", "pids", "tracking"]}},
    {"name": "gpu-02", "state": "NotReady", "cpu": "8", "memory": "64Gi", "devices": [],
     "labels": {}, "enforcement": {"mode": "required", "cgroup": "", "enforced": [],
                                   "problem": "cannot enforce memory: no cgroups"}},
]  # fmt: skip


class FakeClient:
    settings = SimpleNamespace(username="alice", url="http://test")

    def paged(self, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
        return NODES


@pytest.fixture(autouse=True)
def fake_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "client", FakeClient)


def test_nodes_shows_what_each_node_enforces_and_why_one_runs_nothing() -> None:
    out = CliRunner().invoke(main.cli, ["nodes"]).output.splitlines()
    assert "ENFORCES" in out[0].split()
    rows = {line.split()[0]: line.split() for line in out[1:3]}
    assert "v1:cpu,memory,pids,tracking" in rows["gpu-01"]
    assert "-" in rows["gpu-02"]
    assert "gpu-02: cannot enforce memory: no cgroups" in out
