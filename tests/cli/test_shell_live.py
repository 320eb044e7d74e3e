"""`berth shell` and `berth attach` end to end (docs/interactive.md): the console script on a
pseudo-terminal (pexpect) against daphne (websockets), `run_scheduler` and a real agent as
separate processes on the PostgreSQL test database, relaying through Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from bench.processes import free_port, start_daphne
from scheduler.models import Event, Job, Queue, ShellSession
from scheduler.states.names import JobState
from tests.e2e.conftest import JOIN_TOKEN, Cluster, database_url, skip_unless_shared_stack, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]
BERTH = str(Path(sys.executable).with_name("berth"))


@pytest.fixture
def shell_cluster(transactional_db: None, tmp_path: Path) -> Iterator[Cluster]:
    """daphne (the web tier with websockets), the scheduler loop and one agent."""
    skip_unless_shared_stack(
        "the processes share the test database",
        "sessions are relayed through the channel layer",
    )
    Queue.objects.get_or_create(name="default")
    env = {**os.environ, "DATABASE_URL": database_url(), "BERTH_JOIN_TOKEN": JOIN_TOKEN,
           "BERTH_SECRET_KEY": "e2e-tests-only-secret-key-never-in-production-0123456789",
           "BERTH_HEARTBEAT_INTERVAL": "1", "BERTH_HEARTBEAT_TIMEOUT": "6",
           "BERTH_KILL_GRACE_SECONDS": "1", "BERTH_DATA_DIR": str(tmp_path / "data"),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("BERTH_TEST_DB_NAME", None)
    port = free_port()
    daphne = start_daphne(port, env, tmp_path / "daphne.log")
    cluster = Cluster(url=f"http://127.0.0.1:{port}", env=env, tmp=tmp_path)
    try:
        cluster.agent("shell-a")
        cluster.scheduler()
        yield cluster
    finally:
        cluster.stop()
        daphne.terminate()
        daphne.wait(timeout=10)


def user_token(name: str) -> str:
    user = User.objects.create_user(name, password=f"{name}-pass-123")
    return Token.objects.create(user=user).key


def spawn(cluster: Cluster, token: str, *args: str, rows: int = 24, cols: int = 80) -> Any:
    env = {**os.environ, "BERTH_URL": cluster.url, "BERTH_TOKEN": token, "TERM": "xterm",
           "XDG_CONFIG_HOME": str(cluster.tmp / "config")}  # fmt: skip
    child = pexpect.spawn(BERTH, list(args), env=env, dimensions=(rows, cols), timeout=90,
                          cwd=str(cluster.tmp))  # fmt: skip
    child.logfile_read = open(cluster.tmp / "pty.log", "ab")  # noqa: SIM115 - for failures
    return child


def finish(child: Any) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return int(child.exitstatus)


def submitted(child: Any) -> int:
    child.expect(r"Submitted interactive job (\d+)")
    return int(child.match.group(1))


def test_shell_runs_a_command_on_a_terminal_in_the_task_and_exits_with_its_status(
    shell_cluster: Cluster,
) -> None:
    token = user_token("alice")
    script = "tty; echo job=$BERTH_JOB_ID; cat /proc/self/cgroup; exit 7"
    child = spawn(shell_cluster, token, "shell", "--cpu", "0.1", "--mem", "64Mi", "--",
                  "bash", "-c", script)  # fmt: skip
    job_id = submitted(child)
    child.expect(r"/dev/pts/\d+")
    child.expect(rf"job={job_id}\r\n")
    task = Job.objects.get(pk=job_id).tasks.get()
    # The session's processes are in the task's cgroup: held to its limits, counted as it.
    child.expect(re.escape(f"task-{task.pk}-{task.attempt}"))
    assert finish(child) == 7
    # The job ends with its session, and both ends of the session are on its record.
    # ... as its command did: exit status 7 fails it, with the reason SessionEnded.
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.FAILED, what="job to end")
    ended = Job.objects.get(pk=job_id)
    assert ended.reason == "SessionEnded" and "exit status 7" in ended.message
    kinds = list(Event.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds.count("ShellOpened") == 1 and kinds.count("ShellClosed") == 1
    session = ShellSession.objects.get(job_id=job_id)
    assert (session.state, session.reason, session.exit_status) == ("Closed", "Exited", 7)


def test_a_resize_reaches_the_remote_and_ctrl_c_interrupts_the_remote_program(
    shell_cluster: Cluster,
) -> None:
    token = user_token("alice")
    script = "stty size; read go; stty size; echo sleeping; sleep 300"
    child = spawn(shell_cluster, token, "shell", "--cpu", "0.1", "--mem", "64Mi", "--",
                  "bash", "-c", script, rows=30, cols=100)  # fmt: skip
    submitted(child)
    child.expect(r"30 100\r\n")
    child.setwinsize(40, 120)  # SIGWINCH: the CLI sends the new size before the next line
    child.sendline("go")
    child.expect(r"40 120\r\n")
    child.expect("sleeping")
    child.sendcontrol("c")  # the byte goes to the remote terminal: SIGINT to `sleep` there
    assert finish(child) == 130


def test_attach_opens_another_terminal_in_your_running_job_and_never_in_anothers(
    shell_cluster: Cluster,
) -> None:
    alice, bob = user_token("alice"), user_token("bob")
    env = {**os.environ, "BERTH_URL": shell_cluster.url, "BERTH_TOKEN": alice}
    out = subprocess.run([BERTH, "submit", "--cpu", "0.1", "--mem", "64Mi", "--", "sleep",
                          "300"], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    job_id = int(out.stdout.split()[-1])
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, what="job to run")

    refused = spawn(shell_cluster, bob, "attach", str(job_id), "--", "echo", "intruder")
    assert finish(refused) == 1
    assert b"intruder" not in refused.before and b"refused" in refused.before

    mine = spawn(shell_cluster, alice, "attach", str(job_id), "--", "sh", "-c",
                 "echo in-job-$BERTH_JOB_ID; exit 3")  # fmt: skip
    mine.expect(f"in-job-{job_id}")
    assert finish(mine) == 3
    # A batch job is not interactive: it keeps running after a session in it ends.
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING
    assert not ShellSession.objects.filter(job_id=job_id, user__username="bob").exists()
