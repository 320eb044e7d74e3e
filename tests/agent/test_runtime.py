"""The agent runs real processes: output, exit codes, kills of whole groups, restarts."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from scheduler.agent.runtime import Agent


class RecordingAgent(Agent):
    """An agent whose server is a list of scripted answers, recording what it was sent."""

    def __init__(self, tmp: Path, **kw: Any) -> None:
        super().__init__("http://server.invalid", "join", name="test-node", work_dir=tmp, **kw)
        self.token = "t"
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[dict[str, Any]] = []

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        self.sent.append((path, body))
        if path == "heartbeat/":
            return self.answers.pop(0) if self.answers else {}
        return {}

    def reports(self) -> list[dict[str, Any]]:
        return [t for path, body in self.sent if path == "heartbeat/" for t in body["tasks"]]

    def output(self, task_id: int) -> str:
        return "".join(b["data"] for p, b in self.sent if p == f"tasks/{task_id}/log/")


def start_order(task_id: int, command: str, **env: str) -> dict[str, Any]:
    return {"id": task_id, "attempt": 0, "command": command, "env": env}


def run_until(agent: RecordingAgent, done: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        agent.step()
        time.sleep(0.05)


def test_it_runs_a_command_and_reports_its_output_and_exit_code(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(1, 'echo "hi $GREETING"; exit 3', GREETING="there")]}]
    run_until(agent, lambda: any(r["state"] == "Failed" for r in agent.reports()))
    final = [r for r in agent.reports() if r["state"] == "Failed"][0]
    assert (final["id"], final["exit_code"]) == (1, 3)
    assert agent.output(1) == "hi there\n"


def test_it_kills_the_whole_group_with_sigterm_then_sigkill(tmp_path):
    agent = RecordingAgent(tmp_path)
    marker = tmp_path / "child.pid"
    # The task traps TERM and has a child that ignores it: only SIGKILL ends them.
    command = f"trap '' TERM; (trap '' TERM; echo $$ > {marker}; sleep 60) & echo started; sleep 60"
    agent.answers = [{"start": [start_order(2, command)]}]
    run_until(agent, lambda: marker.exists() and marker.read_text().strip())
    child = int(marker.read_text())
    agent.answers = [{"kill": [{"id": 2, "attempt": 0, "grace_seconds": 0.3}]}]
    started = time.monotonic()
    run_until(agent, lambda: any(r["state"] == "Killed" for r in agent.reports()))
    assert time.monotonic() - started >= 0.3  # SIGTERM first, SIGKILL after the grace
    time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_a_restarted_agent_re_adopts_its_running_tasks(tmp_path):
    first = RecordingAgent(tmp_path)
    first.answers = [{"start": [start_order(3, "echo before; sleep 1; echo after; exit 4")]}]
    first.step()
    first.step()
    pid = first.tasks[3].pid
    # The agent dies (its Popen handle with it); a new one starts from the state file.
    second = RecordingAgent(tmp_path)
    second._load()
    assert second.tasks[3].pid == pid and second.tasks[3].proc is None
    run_until(second, lambda: any(r["state"] == "Failed" for r in second.reports()))
    final = [r for r in second.reports() if r["state"] == "Failed"][0]
    assert final["exit_code"] == 4  # learned from the wrapper's exit file
    assert "after" in first.output(3) + second.output(3)


def test_it_forgets_a_task_once_the_server_has_its_end_and_output(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(4, "true")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    agent.step()
    assert 4 not in agent.tasks
