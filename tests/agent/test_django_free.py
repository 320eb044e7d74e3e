"""`python -m scheduler.agent` runs on a node without Django: in a process with no
DJANGO_SETTINGS_MODULE it shows its help, refuses bad flags, and joins a live server and runs a
task, and `django` is never imported; the agent's unit tests pass without Django settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from scheduler.models import Node, Task, TaskLog
from scheduler.states.names import TaskState
from tests.factories import make_job
from tests.management.test_run_agent import JOIN, LOCK, assign, wait_for
from tests.management.test_run_agent import server as server  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]
# Runs the agent's entry point as `python -m scheduler.agent` does, then says on stderr whether
# anything imported Django (at exit, so a real run stopped by SIGTERM is checked too).
HARNESS = """
import atexit, runpy, sys
atexit.register(lambda: print("django imported:", "django" in sys.modules, file=sys.stderr))
runpy.run_module("scheduler.agent", run_name="__main__", alter_sys=True)
"""
# The agent's own tests: its processes, launch, back-pressure and GPU samples (the protocol's
# server side, tests/agentapi/, needs Django).
AGENT_UNIT_TESTS = [
    "tests/agent/test_runtime.py",
    "tests/agent/test_task_shell.py",
    "tests/agent/test_backpressure.py",
    "tests/agent/test_gpu_samples.py",
    "tests/agent/test_gpu_sharing.py",
]


def node_env(**extra: str) -> dict[str, str]:
    """A node's environment: no Django settings, no server secrets."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "BERTH_SECRET_KEY")}  # fmt: skip
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def agent_process(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HARNESS, *args], cwd=ROOT, env=node_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_its_help_needs_no_django():
    out, err = agent_process("--help").communicate(timeout=60)
    assert "usage: python -m scheduler.agent" in out and "--join-token-file" in out
    assert "django imported: False" in err


def test_a_bad_flag_exits_2_naming_it_without_django():
    proc = agent_process("--server", "localhost:8000", BERTH_JOIN_TOKEN="x")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--server: expected an http(s):// URL" in err and "django imported: False" in err


def test_it_joins_a_live_server_and_runs_a_task_without_django(server, owner, tmp_path):
    work = tmp_path / "agent"
    proc = agent_process("--server", server, "--name", "plain-node", "--work-dir", str(work),
                         BERTH_JOIN_TOKEN=JOIN)  # fmt: skip
    try:
        node = wait_for(lambda: Node.objects.filter(name="plain-node").first(), what="register")
        with LOCK:
            job = make_job(owner, command='xs=(a b); [[ ${#xs[@]} == 2 ]] && echo "2 in $PWD"')
            task = job.tasks.get()
            assign(task, node, [])

        def ended() -> Task | None:
            task.refresh_from_db()
            return task if task.state in (TaskState.SUCCEEDED, TaskState.FAILED) else None

        wait_for(ended, what="the task to end")
        output = "".join(TaskLog.objects.filter(task=task).values_list("data", flat=True))
        assert task.state == TaskState.SUCCEEDED, output
        (workdir,) = work.glob(f"task-{task.pk}-0-*")
        assert output == f"2 in {workdir.resolve()}\n"
        assert task.started_at is not None and task.finished_at is not None
        assert task.started_at <= task.finished_at
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "django imported: False" in err


def test_the_agents_unit_tests_pass_without_django_settings():
    """Without pytest-django, the root conftest (which imports Django) or its settings."""
    command = [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider",
               "--noconftest", "-q", *AGENT_UNIT_TESTS]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=node_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
