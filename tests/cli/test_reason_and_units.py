"""`berth jobs` fills REASON for every waiting job (one no cycle has looked at yet says so,
rather than a blank or how an earlier attempt ended), and memory prints with units
(`23.5Gi`, not `24684096Ki`) in `berth nodes` and `berth show` (issue #24)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main
from berth.cli.output import memory_text

JOBS = [
    {"id": 3, "name": "fresh", "owner": "alice", "queue": "default", "state": "Pending",
     "status": None, "message": "", "reason": ""},
    {"id": 2, "name": "requeued", "owner": "alice", "queue": "default", "state": "Pending",
     "status": None, "message": "node gpu-01 lost", "reason": "NodeLost"},
    {"id": 1, "name": "resumed", "owner": "alice", "queue": "default", "state": "Suspended",
     "status": None, "message": "", "reason": "Preempted"},
]  # fmt: skip
NODES = [{"name": "gpu-01", "state": "Ready", "cpu": "8", "memory": "24684096Ki", "devices": []}]
TASK = {"id": 9, "group": "main", "index": 0, "state": "Succeeded", "node": "gpu-01",
        "devices": [], "exit_code": 0, "attempt": 0, "reason": "", "message": "",
        "usage": {"peak_memory": 1536 * 2**20, "memory": 16 * 2**30}}  # fmt: skip


class FakeClient:
    def paged(self, path: str, **params: Any) -> list[dict[str, Any]]:
        return NODES if path == "nodes/" else JOBS

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return {**JOBS[0], "state": "Succeeded", "tasks": [TASK]}


@pytest.fixture
def berth(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(main, "client", FakeClient)
    return CliRunner()


def test_it_fills_reason_for_every_waiting_job(berth: CliRunner) -> None:
    out = berth.invoke(main.cli, ["jobs", "--all"]).output.splitlines()
    assert [line.split()[-1] for line in out[1:]] == ["AwaitingCycle"] * 3


def test_it_prints_node_memory_and_peaks_with_units(berth: CliRunner) -> None:
    nodes = berth.invoke(main.cli, ["nodes"]).output
    assert "23.5Gi" in nodes and "Ki" not in nodes
    shown = berth.invoke(main.cli, ["show", "3"]).output
    assert "1.5Gi/16Gi" in shown


@pytest.mark.parametrize(
    ("value", "text"),
    [("24684096Ki", "23.5Gi"), (2**30, "1Gi"), ("16Gi", "16Gi"), (1536 * 2**20, "1.5Gi"),
     ("512Mi", "512Mi"), (500, "500"), (0, "0"), (None, None), ("odd", "odd")],
)  # fmt: skip
def test_memory_text(value: Any, text: str | None) -> None:
    assert memory_text(value) == text
