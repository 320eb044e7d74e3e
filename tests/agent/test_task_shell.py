"""How the agent launches a command: `bash -lc` (bash syntax and login profile) when bash
exists, else `/bin/sh -c`; in its work dir; the job's env kept; the process's own start and end
times reported. No Django here: these run without Django settings (test_django_free.py)."""

from __future__ import annotations

import time
from pathlib import Path

from scheduler.agent import runtime
from tests.agent.test_runtime import RecordingAgent, run_until, start_order


def run_one(agent: RecordingAgent, command: str, **env: str) -> dict[str, object]:
    """Run `command` as task 1 and return its final report."""
    agent.answers = [{"start": [start_order(1, command, **env)]}]
    run_until(agent, lambda: any(r["state"] != "Running" for r in agent.reports()))
    return next(r for r in agent.reports() if r["state"] != "Running")


def test_a_command_written_for_bash_runs_under_bash(tmp_path):
    agent = RecordingAgent(tmp_path)
    command = 'words=(one two three); [[ ${#words[@]} -eq 3 ]] && echo "${words[1]} of 3"'
    final = run_one(agent, command)
    assert (final["state"], final["exit_code"]) == ("Succeeded", 0)
    assert agent.output(1) == "two of 3\n"


def test_it_is_a_login_shell_that_keeps_the_jobs_environment(tmp_path):
    """The login profile (Debian's /etc/profile sets PATH) runs first; the job's variables
    are exported again after it, so they win."""
    agent = RecordingAgent(tmp_path)
    command = 'shopt -q login_shell && echo login; echo "$PATH|$GREETING"'
    run_one(agent, command, PATH="/opt/tools/bin:/usr/bin:/bin", GREETING='it\'s "quoted" $x')
    assert agent.output(1) == 'login\n/opt/tools/bin:/usr/bin:/bin|it\'s "quoted" $x\n'


def test_it_starts_in_the_tasks_work_dir(tmp_path):
    agent = RecordingAgent(tmp_path)
    run_one(agent, "pwd; touch made-here")
    (workdir,) = (w.resolve() for w in tmp_path.glob("task-1-0-*"))
    assert agent.output(1) == f"{workdir}\n"
    assert (workdir / "made-here").exists()


def test_without_bash_it_runs_the_command_with_sh(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "login_bash", lambda: None)
    agent = RecordingAgent(tmp_path)
    final = run_one(agent, 'echo "${BASH_VERSION:-no bash} in $(pwd)"')
    assert final["state"] == "Succeeded"
    (workdir,) = tmp_path.glob("task-1-0-*")
    assert agent.output(1) == f"no bash in {workdir.resolve()}\n"


def test_the_jobs_text_never_appears_on_a_command_line_or_in_a_wrapper_variable(tmp_path):
    """Every process on the node can read /proc/*/cmdline; only the owner reads environ. The
    command's own processes have their own command lines (`sleep 30`); the wrapper and the
    shell that run it show none of the job's text, and no variable repeats its exports."""
    agent = RecordingAgent(tmp_path)
    command = ": secret-step-$API_KEY; sleep 30"
    agent.answers = [{"start": [start_order(1, command, API_KEY="s3cr3t-value")]}]
    run_until(agent, lambda: any(r["state"] == "Running" for r in agent.reports()))
    group = agent.tasks[1].pid
    try:
        run_until(agent, lambda: any("sleep 30" in _cmdline(p) for p in _group_members(group)))
        lines = [_cmdline(pid) for pid in _group_members(group)]
        assert not any("s3cr3t-value" in line or "secret-step" in line for line in lines)
        environ = Path(f"/proc/{group}/environ").read_bytes().split(b"\0")
        assert [v for v in environ if b"s3cr3t-value" in v] == [b"API_KEY=s3cr3t-value"]
    finally:
        agent.kill(agent.tasks[1], 0.1)
        run_until(agent, lambda: any(r["state"] == "Killed" for r in agent.reports()))


def test_the_report_carries_the_processes_own_start_and_end(tmp_path):
    agent = RecordingAgent(tmp_path)
    before = time.time()
    final = run_one(agent, "sleep 0.2")
    after = time.time()
    started, ended = final["started_at"], final["ended_at"]
    assert isinstance(started, float) and isinstance(ended, float)
    assert before <= started <= ended <= after
    running = [r for r in agent.reports() if r["state"] == "Running"]
    assert all(r["started_at"] == started and r["ended_at"] is None for r in running)


def test_a_task_that_could_not_start_reports_no_times(tmp_path):
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [{**start_order(1, "true"), "env": {"BAD": "\0"}}]}]
    run_until(agent, lambda: any(r["state"] == "Failed" for r in agent.reports()))
    final = next(r for r in agent.reports() if r["state"] == "Failed")
    assert (final["started_at"], final["ended_at"]) == (None, None)


def _group_members(group: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[-1].split()[2]) == group:
                members.append(int(entry.name))
    return members


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
