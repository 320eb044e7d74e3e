"""`manage.py run_agent` for real: a separate process that joins a live server over HTTP,
runs an assigned task as a real process and ships its output and exit code.

On SQLite the live server's threads and the test share one in-memory connection, so the
server handles one request at a time and the test reads and writes rows between requests
(`LOCK`); on PostgreSQL that costs nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import CommandError, call_command

from scheduler.models import Allocation, Node, Queue, Task, TaskLog
from scheduler.states.names import TaskState
from tests.factories import make_job

ROOT = Path(__file__).resolve().parents[2]
JOIN = "command-join-token"
LOCK = threading.RLock()


def wait_for(check: Callable[[], Any], timeout: float = 8.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with LOCK:
            value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def manage(tmp: Path, *args: str, **env_vars: str) -> subprocess.Popen[bytes]:
    """Start a management command as its own process; its output goes to tmp/command.log.
    It finds the join token in BERTH_JOIN_TOKEN, as an agent does."""
    env = {**os.environ, "BERTH_DATA_DIR": str(tmp / "data"), "PYTHONUNBUFFERED": "1",
           "BERTH_JOIN_TOKEN": JOIN, **env_vars}  # fmt: skip
    with open(tmp / "command.log", "wb") as log:
        return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@pytest.fixture
def server(
    transactional_db: None, live_server: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    handle = WSGIHandler.__call__

    def one_at_a_time(self: WSGIHandler, environ: Any, start_response: Any) -> Any:
        with LOCK:
            return handle(self, environ, start_response)

    monkeypatch.setattr(WSGIHandler, "__call__", one_at_a_time)
    settings.BERTH_JOIN_TOKEN = JOIN
    settings.BERTH_HEARTBEAT_INTERVAL = 0.1
    settings.BERTH_KILL_GRACE_SECONDS = 1.0
    Queue.objects.get_or_create(name="default")  # transactional tests flush the migration's
    yield live_server.url


def assign(task: Task, node: Node, devices: list[int]) -> None:
    """What the scheduler does when it binds a task to a node and devices."""
    Task.objects.filter(pk=task.pk).update(state=TaskState.ASSIGNED, node=node)
    for index in devices:
        Allocation.objects.create(task=task, device=node.devices.get(index=index))


def test_it_registers_runs_a_task_end_to_end_and_stops_cleanly(server, owner, tmp_path):
    work = tmp_path / "agent"
    agent = manage(tmp_path, "run_agent", "--server", server,
                   "--name", "cmd-node", "--labels", "zone=a,rack=3", "--fake-gpus", "2",
                   "--work-dir", str(work))  # fmt: skip
    try:
        node = wait_for(lambda: Node.objects.filter(name="cmd-node").first(), what="register")
        with LOCK:
            assert node.labels == {"zone": "a", "rack": "3"} and node.cpu > 0 and node.memory > 0
            assert list(node.devices.values_list("index", "uuid", "model")) == [
                (0, "fake-cmd-node-0", "fake"), (1, "fake-cmd-node-1", "fake")]  # fmt: skip
            job = make_job(owner, gpu=1, command='echo "hi on $CUDA_VISIBLE_DEVICES rank $RANK"')
            task = job.tasks.get()
            assign(task, node, [1])

        def done() -> Task | None:
            task.refresh_from_db()
            return task if task.state == TaskState.SUCCEEDED else None

        wait_for(done, what="the task to succeed")
        assert task.exit_code == 0 and task.started_at and task.finished_at
        output = wait_for(
            lambda: "".join(TaskLog.objects.filter(task=task).values_list("data", flat=True)),
            what="its output",
        )
        assert output == "hi on 1 rank 0\n"
        with LOCK:
            assert not Allocation.objects.filter(task=task).exists()
        assert (work / "state" / "state.json").exists()
    finally:
        code = stop(agent)
    assert code == 0, (tmp_path / "command.log").read_text()


def test_it_exits_with_a_clear_error_on_bad_options(monkeypatch):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "x")
    with pytest.raises(CommandError, match="--server"):
        call_command("run_agent", "--server", "localhost:8000")
    with pytest.raises(CommandError, match="--labels"):
        call_command("run_agent", "--server", "http://x", "--labels", "a")
    with pytest.raises(CommandError, match="--fake-gpus"):
        call_command("run_agent", "--server", "http://x", "--fake-gpus", "-1")


@pytest.mark.parametrize("command", ["run_agent", "run_simagent"])
def test_it_refuses_to_start_without_a_join_token_source(command, monkeypatch, tmp_path):
    monkeypatch.delenv("BERTH_JOIN_TOKEN", raising=False)
    extra = ["--nodes", "1"] if command == "run_simagent" else []
    with pytest.raises(CommandError, match="BERTH_JOIN_TOKEN or pass --join-token-file"):
        call_command(command, "--server", "http://x", *extra)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CommandError, match="--join-token-file: .* is empty"):
        call_command(command, "--server", "http://x", "--join-token-file", str(tmp_path / "empty"),
                     *extra)  # fmt: skip
    with pytest.raises(CommandError, match="--join-token-file: cannot read"):
        call_command(command, "--server", "http://x", "--join-token-file", str(tmp_path / "nope"),
                     *extra)  # fmt: skip


@pytest.mark.parametrize("command", ["run_agent", "run_simagent"])
def test_it_takes_no_join_token_on_its_command_line(command):
    """A secret on a command line is readable by every process (/proc/*/cmdline)."""
    with pytest.raises(CommandError, match="unrecognized arguments: --join-token secret"):
        call_command(command, "--server", "http://x", "--join-token", "secret", "--nodes", "1")


def test_it_reads_the_join_token_from_a_file_and_never_shows_it(server, tmp_path):
    secret = tmp_path / "join"
    secret.write_text(JOIN + "\n")
    agent = manage(tmp_path, "run_agent", "--server", server, "--name", "file-node",
                   "--join-token-file", str(secret), "--work-dir", str(tmp_path / "agent"),
                   BERTH_JOIN_TOKEN="")  # fmt: skip
    try:
        wait_for(lambda: Node.objects.filter(name="file-node").first(), what="register")
        assert JOIN not in Path(f"/proc/{agent.pid}/cmdline").read_text()
    finally:
        assert stop(agent) == 0, (tmp_path / "command.log").read_text()
