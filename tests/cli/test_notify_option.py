"""`berth submit --notify EVENTS [--notify-webhook URL]` (and `#BERTH --notify` lines) put
`notify` in the spec sent; the server checks it (tests/notifications/)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from berth.cli import main


class FakeClient:
    posted: list[Any] = []

    def post(self, path: str, body: Any = None) -> dict[str, Any]:
        FakeClient.posted.append(body)
        return {"id": 7}


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    FakeClient.posted = []
    monkeypatch.setattr(main, "client", FakeClient)
    return FakeClient.posted


def test_notify_options_reach_the_spec(posted: list[Any]) -> None:
    args = ["submit", "--notify", "end,time_limit_80", "--notify-webhook",
            "https://hooks.example.org/x", "--", "python", "train.py"]  # fmt: skip
    result = CliRunner().invoke(main.cli, args)
    assert result.exit_code == 0, result.output
    assert posted[0]["notify"] == {"events": "end,time_limit_80",
                                   "webhook": "https://hooks.example.org/x"}  # fmt: skip


def test_a_script_line_and_a_spec_file_take_notify(posted: list[Any], tmp_path: Any) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#BERTH --notify fail\npython train.py\n")
    assert CliRunner().invoke(main.cli, ["submit", str(script)]).exit_code == 0
    assert posted[-1]["notify"] == {"events": "fail"}
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nnotify: {events: [end], webhook: https://h.example.org/}\n"
                    "tasks: [{name: main, command: 'true'}]\n")  # fmt: skip
    assert CliRunner().invoke(main.cli, ["submit", "--notify", "begin", str(spec)]).exit_code == 0
    assert posted[-1]["notify"] == {"events": "begin", "webhook": "https://h.example.org/"}
    assert "notify" not in CliRunner().invoke(main.cli, ["submit", "--", "true"]).output
    assert "notify" not in posted[-1]
