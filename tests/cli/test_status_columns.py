"""`berth jobs` shows a waiting job's status code in REASON (NeverFits marked), `berth show`
its message and nodes per reason: from the API's `status` object, with a stand-in server."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main

NEVER = {"code": "NeverFits", "message": "0/2 nodes fit: 2 insufficient gpu",
         "node_reasons": {"insufficient gpu": 2}}  # fmt: skip
JOBS = [
    {"id": 3, "name": "wide", "owner": "alice", "queue": "default", "state": "Pending",
     "status": NEVER, "message": ""},
    {"id": 2, "name": "next", "owner": "alice", "queue": "default", "state": "Pending",
     "status": {"code": "Reserved", "message": "first in line", "node_reasons": {}},
     "estimated_start_at": "2026-11-23T18:00:00Z"},
    {"id": 1, "name": "done", "owner": "alice", "queue": "default", "state": "Succeeded",
     "status": None, "message": "all 1 tasks succeeded"},
]  # fmt: skip


class FakeClient:
    def paged(self, path: str, **params: Any) -> list[dict[str, Any]]:
        return JOBS

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return {**JOBS[0], "tasks": []}


@pytest.fixture
def berth(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(main, "client", FakeClient)
    return CliRunner()


def test_the_reason_column_shows_the_status_code(berth: CliRunner) -> None:
    out = berth.invoke(main.cli, ["jobs", "--all"]).output.splitlines()
    assert out[0].split() == ["ID", "NAME", "USER", "QUEUE", "STATE", "POS", "START", "REASON"]
    assert out[1].split()[-1] == "NeverFits!"
    assert out[2].split()[-1] == "Reserved"
    assert out[3].endswith("all 1 tasks succeeded")


def test_show_prints_the_status_message_and_nodes_per_reason(berth: CliRunner) -> None:
    out = berth.invoke(main.cli, ["show", "3"]).output
    assert "status: NeverFits" in out
    assert "waiting: 0/2 nodes fit: 2 insufficient gpu" in out
    assert "2 node(s): insufficient gpu" in out
