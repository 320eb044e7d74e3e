"""`manage.py up` as root: the local agent's tasks run unprivileged with a clean environment and
cannot read the data dir (secret key, admin password, join token, SQLite database, the agent's
node token). A real `up` process; the job goes in and its output comes out over REST."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pytest

from bench.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_SECRET = "up-server-only-secret-5b1e"


def call(url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def until(check: Any, what: str, timeout: float = 60, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            shown = log.read_text()[-6000:] if log is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{shown}")
        time.sleep(0.3)


def _ended(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job once it ended (what it says of itself), else None."""
    final = ("Succeeded", "Failed", "Cancelled")
    return (
        {k: job.get(k) for k in ("state", "reason", "message")} if job["state"] in final else None
    )


def _up_env(data: Path, **extra: str) -> dict[str, str]:
    """The environment `manage.py up` runs in: none of the test run's settings, its data in
    `data`, short scheduler and heartbeat intervals."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "BERTH_SECRET_KEY", "BERTH_TEST_DB_NAME",
                        "DJANGO_SETTINGS_MODULE", "BERTH_JOIN_TOKEN")}  # fmt: skip
    # Leases every 0.3 s so that the job starts at once; but a node is declared NotReady (and
    # its task lost) only after 30 s of silence, not the 1.3 s that 4.25 x 0.3 would give: in
    # a full CI run the one `up` process tree once stalled that long and the probe failed.
    env.update({"BERTH_DATA_DIR": str(data), "BERTH_SCHEDULER_INTERVAL": "0.3",
                "BERTH_HEARTBEAT_INTERVAL": "0.3", "BERTH_HEARTBEAT_TIMEOUT": "30",
                **extra})  # fmt: skip
    return env


def _spawn_up(env: dict[str, str], port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`manage.py up` on `port`, in a process group of its own."""
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _admin_token(env: dict[str, str], url: str) -> str:
    """Once `up` serves at `url`: an API token of its admin."""
    until(lambda: urllib.request.urlopen(f"{url}/accounts/login/", timeout=1), "up to serve")
    made = subprocess.run([sys.executable, str(ROOT / "manage.py"), "drf_create_token",
                           "admin"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return re.search(r"token (\S+) for user", made.stdout).group(1)  # type: ignore[union-attr]


@pytest.mark.root
def test_up_runs_tasks_unprivileged_and_they_cannot_read_its_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    env = _up_env(data, UP_TEST_SECRET=SERVER_SECRET)
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - closed below
    up = _spawn_up(env, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        token = _admin_token(env, url)
        probe = "; ".join([
            'echo "uid=$(id -u)"', "env", "tr '\\0' '\\n' < /proc/$PPID/environ",
            f"tr '\\0' '\\n' < /proc/{up.pid}/environ", f"ls -la {data}",
            *(f"cat {data / name}" for name in ("secret_key", "admin_password", "join_token",
                                                 "agent/state.json")),
            f"head -c 4096 {data / 'berth.sqlite3'}", "echo probe-done",
        ])  # fmt: skip
        resources = {"cpu": "0.1", "memory": "16Mi"}
        spec = {"name": "probe",
                "tasks": [{"name": "main", "command": probe, "resources": resources}]}  # fmt: skip
        job = call(f"{url}/api/v1/jobs/", token, spec)["id"]
        # Seconds on a quiet machine; the log is shown if it does not end.
        ended = until(lambda: _ended(call(f"{url}/api/v1/jobs/{job}/", token)), "the probe",
                      timeout=180, log=tmp_path / "up.log")  # fmt: skip
        log.flush()
        assert ended["state"] == "Succeeded", (ended, (tmp_path / "up.log").read_text()[-4000:])
        seen = "".join(t["data"] for t in call(f"{url}/api/v1/jobs/{job}/logs/", token)["tasks"])
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=20)
        log.close()

    assert "probe-done" in seen and "Permission denied" in seen, seen
    assert int(seen.split("uid=", 1)[1].split()[0]) != 0
    secrets = [(data / n).read_text().strip() for n in ("secret_key", "admin_password",
                                                        "join_token")]  # fmt: skip
    secrets.append(json.loads((data / "agent" / "state.json").read_text())["token"])
    for secret in [*secrets, SERVER_SECRET]:
        assert secret and secret not in seen
    assert "SQLite format" not in seen
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for name in ("secret_key", "admin_password", "join_token", "berth.sqlite3"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
    # Its output went to a file, not a terminal: the password is not in it, its file's path is.
    printed = (tmp_path / "up.log").read_text()
    assert secrets[1] not in printed and f"the password in {data / 'admin_password'}" in printed


@pytest.mark.django_db
def test_up_prints_the_admin_password_to_a_terminal_only(settings: Any, tmp_path: Path) -> None:
    from scheduler.management.commands.up import Command

    settings.DATA_DIR = tmp_path
    command = Command(stdout=io.StringIO())
    to_a_file = command._ensure_admin()
    password = (tmp_path / "admin_password").read_text().strip()
    assert password not in to_a_file and str(tmp_path / "admin_password") in to_a_file

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert password in Command(stdout=Terminal())._ensure_admin()


def test_up_refuses_task_dirs_inside_its_data_dir(settings: Any, tmp_path: Path) -> None:
    from django.core.management import CommandError, call_command

    settings.DATA_DIR = tmp_path / "data"
    with pytest.raises(CommandError, match="--agent-work-dir: .* is inside the data dir"):
        call_command("up", "--port", "18501", "--agent-work-dir", str(tmp_path / "data" / "t"))
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.root
def test_up_stopping_stops_its_tasks_and_their_daemons(tmp_path: Path) -> None:
    """SIGTERM to `up` alone (not its process group): the task and a daemon it started with
    setsid are gone when `up` has exited, and the server heard the task end before it did."""
    import tempfile

    data, port = tmp_path / "data", free_port()
    marks = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="berth-up-stop-"))  # not /tmp: private
    marks.chmod(0o1777)
    env = _up_env(data)
    with open(tmp_path / "up.log", "wb") as log:
        up = _spawn_up(env, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        token = _admin_token(env, url)
        command = (f"setsid sleep 301 & echo $! > {marks}/daemon; echo $$ > {marks}/task;"
                   " sleep 300")  # fmt: skip
        task = {"name": "main", "command": command, "resources": {"cpu": "0.1", "memory": "32Mi"}}
        job = call(f"{url}/api/v1/jobs/", token, {"name": "long", "tasks": [task]})
        pids = until(lambda: [int((marks / n).read_text()) for n in ("task", "daemon")
                              if (marks / n).read_text().strip()], "the task to start")  # fmt: skip
        until(lambda: len(pids) == 2 or None, "both pids")
        os.kill(up.pid, signal.SIGTERM)
        up.wait(timeout=40)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]  # fmt: skip
    with sqlite3.connect(data / "berth.sqlite3") as db:
        (state,) = db.execute("SELECT state FROM scheduler_task WHERE job_id = ?",
                              (job["id"],)).fetchone()  # fmt: skip
    assert state == "Killed", (tmp_path / "up.log").read_text()


@pytest.mark.django_db
def test_up_gives_its_local_agent_fake_mig_instances_and_refuses_bad_ones(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./run up --fake-gpus 2 --fake-mig 1:1g.10gb,2g.20gb`: MIG profiles to try on a
    laptop, as `run_agent --fake-mig` gives them (the agent's side: tests/agent)."""
    from django.core.management import CommandError, call_command

    from scheduler.management.commands import up

    given: dict[str, Any] = {}

    class LocalAgent:
        def __init__(self, **options: Any) -> None:
            given.update(options)
            self.work_dir = options["work_dir"]

        def prepare(self) -> None:
            pass

    monkeypatch.setattr(up, "Agent", LocalAgent)
    monkeypatch.setattr(up.Command, "_serve", lambda self, *args, **kwargs: None)
    settings.DATA_DIR = tmp_path / "data"
    port = str(free_port())
    call_command("up", "--port", port, "--fake-gpus", "2", "--fake-mig", "1:1g.10gb,2g.20gb",
                 stdout=io.StringIO())  # fmt: skip
    assert given["fake_gpus"] == 2 and given["fake_mig"] == {1: ["1g.10gb", "2g.20gb"]}
    given.clear()
    for bad, why in (("2:1g.10gb", "GPU 2 is not one of the 2 fake GPUs"),
                     ("0:big", "'big' is not a MIG profile")):  # fmt: skip
        with pytest.raises(CommandError, match=f"--fake-mig: {why}"):
            call_command("up", "--port", port, "--fake-gpus", "2", "--fake-mig", bad)
    assert given == {}  # refused before the agent was made
