"""The agent runs real processes: output, exit codes, kills of whole groups, restarts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.runtime import Agent, ServerError, Unavailable, _whole_utf8


class RecordingAgent(Agent):
    """An agent whose server is a list of scripted answers, recording what it was sent."""

    def __init__(self, tmp: Path, **kw: Any) -> None:
        super().__init__("http://server.invalid", "join", name="test-node", work_dir=tmp, **kw)
        self.token = "t"
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[dict[str, Any]] = []

        self.refuse: dict[str, Exception] = {}  # path prefix -> the error the server gives

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        self.sent.append((path, body))
        for prefix, error in self.refuse.items():
            if path.startswith(prefix):
                raise error
        if path == "report/":
            return self.answers.pop(0) if self.answers else {}
        if path == "register/":
            return {"token": "t2", "lease_seconds": 0.05, "kill_grace_seconds": 0.2}
        return {}

    def _lease_post(self, body: dict[str, Any], auth: str) -> dict[str, Any]:
        time.sleep(0.05)  # a held lease with nothing for us
        return {}

    def order(self, answer: dict[str, Any]) -> None:
        """Orders as a lease answer brings them: the main loop carries them out."""
        self.inbox.put((answer, threading.Event()))

    def reports(self) -> list[dict[str, Any]]:
        return [t for path, body in self.sent if path == "report/" for t in body["tasks"]]

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


@contextmanager
def agent_running(agent: Agent, join_timeout: float = 10.0) -> Iterator[threading.Thread]:
    """The agent's main loop on a thread of its own while the block runs; then it is told to
    stop and waited for (at most `join_timeout` seconds)."""
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(join_timeout)


def test_it_runs_a_command_and_reports_its_output_and_exit_code(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(1, 'echo "hi $GREETING"; exit 3', GREETING="there")]}]
    run_until(agent, lambda: any(r["state"] == "Failed" for r in agent.reports()))
    final = [r for r in agent.reports() if r["state"] == "Failed"][0]
    assert (final["id"], final["exit_code"]) == (1, 3)
    assert agent.output(1) == "hi there\n"


def test_it_kills_the_whole_group_with_sigterm_then_sigkill(tmp_path):
    agent = RecordingAgent(tmp_path)
    # The task traps TERM and has a child that ignores it: only SIGKILL ends them.
    command = "trap '' TERM; (trap '' TERM; echo $$ > child.pid; sleep 60) & echo started; sleep 60"
    agent.answers = [{"start": [start_order(2, command)]}]
    run_until(agent, lambda: 2 in agent.tasks)
    marker = Path(agent.tasks[2].workdir) / "child.pid"  # in the task's own work dir
    run_until(agent, lambda: marker.exists() and marker.read_text().strip())
    child = int(marker.read_text())
    agent.order({"kill": [{"id": 2, "attempt": 0, "grace_seconds": 0.3}]})
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


def test_it_re_adopts_its_running_tasks_after_a_restart(tmp_path):
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


def test_it_runs_a_task_in_its_own_group_and_directory_with_its_env(tmp_path):
    agent = RecordingAgent(tmp_path)
    command = 'echo "$(pwd) $CUDA_VISIBLE_DEVICES $RANK ${PATH:+has-path}"; ps -o pgid= -p $$'
    agent.answers = [{"start": [start_order(5, command, CUDA_VISIBLE_DEVICES="1,3", RANK="2")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    first, pgid = agent.output(5).splitlines()
    (workdir,) = tmp_path.glob("task-5-0-*")
    assert first == f"{workdir} 1,3 2 has-path"
    assert int(pgid) != os.getpgid(0)  # a group of its own, apart from the agent's


def test_it_reports_a_task_it_cannot_start_as_failed(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(6, "true", BAD="nul\x00byte")]}]
    agent.step()
    agent.step()
    (report,) = [r for r in agent.reports() if r["id"] == 6]
    assert (report["state"], report["exit_code"]) == ("Failed", 127)
    assert "could not start" in report["message"]


def test_it_refuses_a_start_once_its_disk_filled_and_says_why_in_the_same_report(tmp_path):
    # The main loop looks at the disk once a second; a task placed in between, before the
    # server heard of the pressure, used to start (and fail on the full disk, costing its
    # job a retry, and the next retry could land here again).
    agent = RecordingAgent(tmp_path, min_free_disk=1)
    agent.prepare()  # its directories, as `run` makes them first
    agent.step()  # it looked: room enough
    assert "pressure" not in agent.sent[-1][1]["usage"]
    agent.pressure.min_free = 1 << 62  # the disk fills: less free than the minimum now
    agent.order({"start": [start_order(7, "touch ran")]})  # a lease's answer
    agent.step()  # carries it out: refused, reported at once
    path, body = agent.sent[-1]
    (report,) = [r for r in body["tasks"] if r["id"] == 7]
    assert (path, report["state"], report["exit_code"]) == ("report/", "Failed", 127)
    assert "disk full" in report["message"]
    assert "disk full" in body["usage"]["pressure"]  # the server places nothing more here
    assert not list(tmp_path.rglob("ran"))  # the command never ran


def test_it_keeps_heartbeating_when_the_server_refuses_a_tasks_output(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.refuse["tasks/7/"] = ServerError(404, "task 7 is not on node test-node")
    agent.answers = [{"start": [start_order(7, "echo lost output")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    agent.step()
    assert 7 not in agent.tasks  # reported and forgotten, output given up


def test_it_stops_shipping_output_the_server_no_longer_keeps(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.log_chunk = 1024
    calls = []

    def post(path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        if path.startswith("tasks/"):
            calls.append(body["offset"])
            return {"next_offset": body["offset"] + len(body["data"]), "dropped": True}
        return RecordingAgent._post(agent, path, body, auth)

    agent._post = post  # type: ignore[method-assign]
    agent.answers = [{"start": [start_order(8, "head -c 100000 /dev/zero | tr '\\0' x")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    assert calls == [0]


def test_it_ships_output_without_splitting_characters(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.log_chunk = 1000
    agent.answers = [{"start": [start_order(9, "printf 'é%.0s' $(seq 1 1500)")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    agent.step()
    chunks = [b["data"] for p, b in agent.sent if p == "tasks/9/log/"]
    assert len(chunks) >= 3 and "".join(chunks) == "é" * 1500
    assert all(len(c.encode()) <= 1000 for c in chunks)
    assert _whole_utf8("aé".encode()[:2]) == b"a" and _whole_utf8(b"ab") == b"ab"


def test_it_does_not_adopt_a_process_that_only_reuses_the_pid(tmp_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        state = {"name": "test-node", "token": "t", "server": "http://server.invalid",
                 "tasks": [{"id": 10, "attempt": 0, "pid": other.pid, "dir": str(tmp_path),
                            "started": "1"}]}  # fmt: skip
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "state.json").write_text(json.dumps(state))
        agent = RecordingAgent(tmp_path)
        agent._load()
        agent.step()
        (report,) = agent.reports()
        assert report["state"] == "Failed" and "exit code unknown" in report["message"]
    finally:
        other.kill()
        other.wait()


def test_it_backs_off_while_the_join_token_is_refused(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.token = ""
    agent.refuse["register/"] = ServerError(401, "wrong or missing join token")
    with agent_running(agent, 5):
        time.sleep(1.0)
    registers = [p for p, _ in agent.sent if p == "register/"]
    assert 1 <= len(registers) <= 3  # 0.5 s, then 1 s: no tight loop
    assert not any(p == "report/" for p, _ in agent.sent)


def test_it_registers_again_when_the_server_forgets_its_token(tmp_path):
    agent = RecordingAgent(tmp_path)
    forgotten = [ServerError(401, "unknown node token; register again")]

    def post(path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        if path == "report/" and forgotten:
            agent.sent.append((path, body))
            raise forgotten.pop()
        return RecordingAgent._post(agent, path, body, auth)

    agent._post = post  # type: ignore[method-assign]
    with agent_running(agent, 5):
        deadline = time.monotonic() + 5
        while sum(p == "report/" for p, _ in agent.sent) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    paths = [p for p, _ in agent.sent]
    assert paths[:4] == ["register/", "report/", "register/", "report/"]
    assert agent.token == "t2"


def test_it_leaves_its_tasks_running_when_it_stops(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(11, "sleep 30")]}]
    with agent_running(agent, 5):
        deadline = time.monotonic() + 5
        while 11 not in agent.tasks and time.monotonic() < deadline:
            time.sleep(0.05)
    pid = agent.tasks[11].pid
    try:
        assert _alive(pid)
        saved = json.loads((tmp_path / "state" / "state.json").read_text())
        assert [t["pid"] for t in saved["tasks"]] == [pid]
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_it_kills_its_tasks_on_exit_when_asked_and_says_so(tmp_path):
    agent = RecordingAgent(tmp_path, kill_on_exit=True)
    agent.answers = [{"start": [start_order(12, "sleep 30")]}]
    with agent_running(agent):
        deadline = time.monotonic() + 5
        while 12 not in agent.tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = agent.tasks[12].pid
    assert not _alive(pid)
    assert agent.reports()[-1]["state"] == "Killed"


def test_it_keeps_its_tasks_and_its_report_when_the_server_fails(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(13, "sleep 0.3; echo done")]}]
    agent.step()
    agent.refuse["report/"] = ServerError(500, "down")
    with pytest.raises(ServerError):
        agent.step()
    assert agent.dirty  # the report is still due
    del agent.refuse["report/"]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    assert agent.output(13) == "done\n"


def test_it_waits_as_long_as_the_server_asks_and_then_reports_everything(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(14, "echo done")]}]
    agent.step()
    agent.refuse["report/"] = Unavailable("HTTP 503", retry_after=30.0, status=503)
    agent.refuse["tasks/"] = Unavailable("HTTP 429", retry_after=30.0, status=429)
    deadline = time.monotonic() + 5
    while agent.tasks[14].state == "Running":
        assert time.monotonic() < deadline
        agent.step()  # back-pressure is not an error: nothing raises
        time.sleep(0.05)
    tries = len(agent.sent)
    for _ in range(5):
        agent.step()
    assert len(agent.sent) == tries  # nothing is sent before Retry-After has passed
    assert agent.retry_at - time.monotonic() > 20
    agent.refuse.clear()
    agent.retry_at = 0.0  # as if the 30 s had passed
    agent.step()
    final = agent.reports()[-1]
    assert (final["id"], final["state"], final["output_bytes"]) == (14, "Succeeded", 5)
    assert agent.output(14) == "done\n"
    assert 14 not in agent.tasks
