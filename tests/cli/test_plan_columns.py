"""`berth jobs` and `berth show` say where a waiting job stands: its position in its queue and
its start estimate ("unknown" when the server has none)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main

SOON = (datetime.now(UTC) + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
JOBS = [
    {"id": 3, "name": "c", "owner": "alice", "queue": "default", "state": "Pending",
     "queue_position": 2, "estimated_start_at": None, "pending_reasons": ["Priority"]},
    {"id": 2, "name": "b", "owner": "alice", "queue": "default", "state": "Pending",
     "queue_position": 1, "estimated_start_at": SOON, "pending_reasons": ["Reserved"]},
    {"id": 1, "name": "a", "owner": "alice", "queue": "default", "state": "Running",
     "queue_position": None, "estimated_start_at": None, "pending_reasons": []},
]  # fmt: skip


class FakeClient:
    settings = SimpleNamespace(username="alice", url="http://test")

    def paged(self, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
        return JOBS

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return {**JOBS[1], "tasks": []}


@pytest.fixture(autouse=True)
def fake_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "client", FakeClient)


def test_jobs_shows_position_and_start() -> None:
    out = CliRunner().invoke(main.cli, ["jobs"]).output.splitlines()
    assert out[0].split()[:7] == ["ID", "NAME", "USER", "QUEUE", "STATE", "POS", "START"]
    soon = datetime.fromisoformat(SOON.replace("Z", "+00:00")).astimezone()
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["3"][5:7] == ["2", "unknown"]
    assert rows["2"][5] == "1"
    assert soon.strftime("%H:%M") in " ".join(rows["2"][6:8])
    assert rows["1"][5:7] == ["-", "-"]


def test_show_says_position_and_start() -> None:
    out = CliRunner().invoke(main.cli, ["show", "2"]).output
    assert "position: 1" in out
    assert "start: " in out and "unknown" not in out
