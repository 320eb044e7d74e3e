"""`berth` end to end: the installed console script against a live server with the scheduler
loop and a real agent (PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.models import Job
from scheduler.states.names import JobState
from tests.e2e.conftest import Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]
BERTH = str(Path(sys.executable).with_name("berth"))


def berth(cluster: Cluster, token: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BERTH_URL": cluster.url, "BERTH_TOKEN": token,
           "XDG_CONFIG_HOME": str(cluster.tmp / "config")}  # fmt: skip
    return subprocess.run([BERTH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=kw.get("cwd", cluster.tmp), input=kw.get("input"))  # fmt: skip


def submitted_id(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("Submitted job "))
    return int(line.split()[-1])


@pytest.fixture
def running(cluster: Cluster) -> Cluster:
    cluster.agent("cli-a")
    cluster.scheduler()
    return cluster


def test_submit_command_waits_and_exits_with_the_jobs_status(running: Cluster, token: str):
    ok = berth(running, token, "submit", "--cpu", "0.1", "--mem", "16Mi", "--wait", "--",
               "echo", "hello from cli")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    job_id = submitted_id(ok.stdout)
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED

    bad = berth(running, token, "submit", "--cpu", "0.1", "--mem", "16Mi", "-W", "--",
                "sh", "-c", "exit 3")  # fmt: skip
    assert bad.returncode == 3, bad.stderr
    assert Job.objects.get(pk=submitted_id(bad.stdout)).state == JobState.FAILED

    logs = berth(running, token, "logs", str(job_id))
    assert logs.returncode == 0 and logs.stdout == "hello from cli\n"


def test_a_script_carries_its_options_in_berth_lines(running: Cluster, token: str):
    script = running.tmp / "Train.sh"
    script.write_text("#!/bin/bash\n#BERTH --time 1h30m --cpu 0.1\n#BERTH --mem 16Mi\n"
                      "echo step $((6 * 7))\n")  # fmt: skip
    done = berth(running, token, "submit", "--wait", str(script))
    assert done.returncode == 0, done.stderr
    job = Job.objects.get(pk=submitted_id(done.stdout))
    assert (job.name, job.walltime, job.state) == ("train", 5400, JobState.SUCCEEDED)
    assert berth(running, token, "logs", str(job.pk)).stdout == "step 42\n"


def test_a_spec_file_submits_and_listings_speak_json(running: Cluster, token: str):
    spec = running.tmp / "job.yaml"
    spec.write_text("name: from-file\ntasks:\n- name: main\n  command: sleep 30\n"
                    "  resources: {cpu: 0.1, memory: 16Mi}\n")  # fmt: skip
    out = berth(running, token, "submit", str(spec), "--queue", "default")
    job_id = submitted_id(out.stdout)
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, what="job to run")

    listed = json.loads(berth(running, token, "jobs", "--json").stdout)
    assert [j["id"] for j in listed] == [job_id] and listed[0]["state"] == "Running"
    table = berth(running, token, "jobs", "--state", "Running").stdout.splitlines()
    # POS and START (tests/cli/test_plan_columns.py) sit between STATE and REASON.
    header = table[0].split()
    assert header[:5] == ["ID", "NAME", "USER", "QUEUE", "STATE"] and header[-1] == "REASON"
    assert table[1].split()[:5] == [str(job_id), "from-file", "alice", "default", "Running"]

    shown = json.loads(berth(running, token, "show", str(job_id), "--json").stdout)
    assert shown["tasks"][0]["node"] == "cli-a"
    nodes = berth(running, token, "nodes").stdout
    assert "cli-a" in nodes and "Ready" in nodes

    cancel = berth(running, token, "cancel", str(job_id))
    assert cancel.returncode == 0, cancel.stderr
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.CANCELLED, what="cancel")


def test_logs_follow_a_running_job_until_it_ends(running: Cluster, token: str):
    out = berth(running, token, "submit", "--cpu", "0.1", "--mem", "16Mi", "--", "sh", "-c",
                "for i in 1 2 3; do echo line $i; sleep 1; done")  # fmt: skip
    job_id = submitted_id(out.stdout)
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, what="job to run")
    follow = berth(running, token, "logs", "-f", str(job_id))
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout == "line 1\nline 2\nline 3\n"
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED


def test_a_bad_spec_prints_the_servers_field_messages(cluster: Cluster, token: str):
    bad = berth(cluster, token, "submit", "--gpus", "1", "--mem", "lots", "--", "true")
    assert bad.returncode == 1
    assert "tasks.0.resources.memory" in bad.stderr
    assert not Job.objects.exists()

    other = berth(cluster, token, "show", "999999")
    assert other.returncode == 1 and "berth:" in other.stderr

    nobody = berth(cluster, "not-a-token", "jobs")
    assert nobody.returncode == 1 and "invalid token" in nobody.stderr.lower()


def test_login_keeps_a_private_token_that_later_commands_use(cluster: Cluster, owner: Any):
    config = cluster.tmp / "home-config"
    env = {k: v for k, v in os.environ.items() if k not in ("BERTH_URL", "BERTH_TOKEN")}
    env["XDG_CONFIG_HOME"] = str(config)

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([BERTH, *args], env=env, capture_output=True, text=True,
                              input=stdin, timeout=60)  # fmt: skip

    wrong = run("login", cluster.url, "-u", "alice", stdin="not-her-password\n")
    assert wrong.returncode == 1 and "invalid username or password" in wrong.stderr
    assert not (config / "berth" / "config.json").exists()

    ok = run("login", cluster.url, "-u", "alice", stdin="alice-pass-123\n")
    assert ok.returncode == 0, ok.stderr
    saved = config / "berth" / "config.json"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert json.loads(saved.read_text())["username"] == "alice"
    listed = run("jobs", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
