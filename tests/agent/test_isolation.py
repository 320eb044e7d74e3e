"""What a task can reach, through the agent's real processes: its environment is built from
scratch, it never runs as root, and the agent refuses a root or missing task account."""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat

import pytest
from django.core.management import CommandError, call_command

from scheduler.agent import isolation
from tests.agent.test_runtime import RecordingAgent, run_until, start_order


def test_a_task_gets_a_fresh_environment_not_the_agents(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/berth")
    monkeypatch.setenv("BERTH_SECRET_KEY", "agent-secret-key")
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "agent-join-token")
    agent = RecordingAgent(tmp_path)
    agent.answers = [{"start": [start_order(1, "env", GREETING="hi", PATH="/opt/x:/usr/bin")]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    env = dict(line.split("=", 1) for line in agent.output(1).splitlines())
    (workdir,) = tmp_path.glob("task-1-0-*")
    account = pwd.getpwuid(workdir.stat().st_uid)
    assert set(env) - {"PWD", "SHLVL", "_", "OLDPWD"} == {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "GREETING"}  # fmt: skip
    assert env["GREETING"] == "hi" and env["PATH"] == "/opt/x:/usr/bin"  # the job's env wins
    assert (env["USER"], env["HOME"]) == (account.pw_name, account.pw_dir)


@pytest.mark.root
def test_as_root_with_no_uid_range_a_task_runs_as_the_task_account_in_its_own_dir(tmp_path):
    agent = RecordingAgent(tmp_path, task_user="nobody", task_uids=None)
    order = {**start_order(2, "id -u; id -un; touch mine; ls"), "owner": "root"}
    agent.answers = [{"start": [order]}]
    run_until(agent, lambda: any(r["state"] == "Succeeded" for r in agent.reports()))
    nobody = pwd.getpwnam("nobody")
    assert agent.output(2) == f"{nobody.pw_uid}\nnobody\nmine\n"  # a Berth user "root" too
    (work,) = tmp_path.glob("task-2-0-*")
    assert (work.stat().st_uid, stat.S_IMODE(work.stat().st_mode)) == (nobody.pw_uid, 0o700)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o711
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700


@pytest.mark.root
@pytest.mark.parametrize(("user", "message"), [("root", "never run as root"),
                                               ("no-such-user-x", "does not exist")])  # fmt: skip
def test_as_root_the_agent_refuses_a_root_or_missing_task_account(user, message, monkeypatch):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "x")
    with pytest.raises(CommandError, match=message):
        call_command("run_agent", "--server", "http://x", "--task-user", user)


def test_an_agent_that_is_not_root_says_its_tasks_run_as_itself(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="berth.agent")
    RecordingAgent(tmp_path).prepare()
    expected = "tasks run as the submitting user's" if os.geteuid() == 0 else "not running as root"
    assert expected in caplog.text


def test_without_root_every_task_runs_as_the_agents_own_account(monkeypatch):
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 4321)  # as an unprivileged agent
    accounts = isolation.TaskAccounts("root")  # nothing to refuse: it cannot switch anyway
    assert not accounts.switching and accounts.for_owner("alice").uid == 4321
    assert isolation.spawn_kwargs(accounts.for_owner("alice"), accounts.switching) == {}
    assert "not running as root: tasks run as this agent's own user" in accounts.describe()


def test_an_upgraded_agent_moves_its_old_state_file_out_of_the_tasks_reach(tmp_path):
    old = {"name": "test-node", "token": "kept-token", "server": "http://server.invalid",
           "tasks": []}  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(old))
    agent = RecordingAgent(tmp_path)
    agent.token = ""
    agent.prepare()
    agent._load()
    assert agent.token == "kept-token" and not (tmp_path / "state.json").exists()
    assert stat.S_IMODE((tmp_path / "state" / "state.json").stat().st_mode) == 0o600
