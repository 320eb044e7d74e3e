"""Tasks are isolated from Berth, and node identity is kept (issue 11, findings 1 and 2).

Real `run_agent` processes as root, with the server's secrets in their environment, run jobs
submitted over REST; what a task can see is read back through the logs API.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from scheduler.agent.client import PROTOCOL
from scheduler.agent.isolation import DEFAULT_TASK_UIDS
from scheduler.models import Event, Node, Task
from scheduler.states.names import JobState
from tests.e2e.conftest import Cluster, wait_for
from tests.e2e.test_e2e_jobs import job_state, one_task, submit

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.root]
SECRET_KEY = f"isolation-secret-{secrets.token_hex(32)}"  # 50+ characters: DEBUG is off
JOIN = f"isolation-join-{secrets.token_hex(8)}"  # unique: other processes may show theirs


@pytest.fixture
def secret_cluster(cluster: Cluster, settings: Any) -> Cluster:
    """The cluster, its agents started with the server's secrets in their environment."""
    settings.BERTH_JOIN_TOKEN = JOIN
    cluster.env.update({"BERTH_SECRET_KEY": SECRET_KEY, "BERTH_JOIN_TOKEN": JOIN})
    return cluster


def output(client: APIClient, job_id: int) -> str:
    logs = client.get(f"/api/v1/jobs/{job_id}/logs/").json()
    return "".join(t["data"] for t in logs["tasks"])


def test_a_task_sees_no_secret_of_the_agent_and_never_runs_as_root(
    secret_cluster: Cluster, api: Any, owner: User
) -> None:
    agent = secret_cluster.agent("iso-a")
    secret_cluster.scheduler()
    work = secret_cluster.tmp / "agent-iso-a"
    state = work / "state"
    probe = "; ".join([
        'echo "uid=$(id -u)"',
        "env",
        "tr '\\0' '\\n' < /proc/$PPID/environ",  # the wrapper that started the command
        "tr '\\0' ' ' < /proc/$PPID/cmdline",
        f"tr '\\0' '\\n' < /proc/{agent.pid}/environ",  # the agent itself
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",  # every process's command line
        f"ls -la {state}",
        f"cat {state}/state.json",
        f"ls {work}",
        "echo probe-done",
    ])  # fmt: skip
    client = api(owner)
    job_id = submit(client, one_task("probe", probe))
    wait_for(lambda: job_state(job_id) == JobState.SUCCEEDED, what="the probe to finish")
    seen = output(client, job_id)
    assert "probe-done" in seen and "Permission denied" in seen, seen

    node_token = json.loads((state / "state.json").read_text())["token"]
    uid = int(seen.split("uid=", 1)[1].split()[0])
    low, high = DEFAULT_TASK_UIDS  # alice has no account here: a uid of her own
    assert low <= uid <= high
    for secret in (SECRET_KEY, JOIN, node_token, secret_cluster.env["DATABASE_URL"]):
        assert secret not in seen
    assert "DATABASE_URL" not in seen and "BERTH_SECRET_KEY" not in seen
    assert "BERTH_JOB_ID" in seen and "HOME=" in seen  # the env it should have
    # The directories, as the agent left them.
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == 0
    assert stat.S_IMODE((state / "state.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(work.stat().st_mode) == 0o711
    (task,) = Task.objects.filter(job_id=job_id)
    (task_dir,) = work.glob(f"task-{task.pk}-0-*")
    assert task_dir.stat().st_uid == uid and stat.S_IMODE(task_dir.stat().st_mode) == 0o700


@pytest.fixture
def unix_alice() -> Iterator[str]:
    """A Unix account of the same name as a Berth user (removed afterwards)."""
    name = f"berthiso{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def test_a_task_runs_as_the_owners_own_account_when_it_exists(
    secret_cluster: Cluster, api: Any, unix_alice: str
) -> None:
    user = User.objects.create_user(unix_alice, password="pw-123456789")
    secret_cluster.agent("iso-c")
    secret_cluster.scheduler()
    client = api(user)
    job_id = submit(client, one_task("mine", 'echo "I am $(id -un) $USER $LOGNAME"'))
    wait_for(lambda: job_state(job_id) == JobState.SUCCEEDED, what="the job to finish")
    assert output(client, job_id) == f"I am {unix_alice} {unix_alice} {unix_alice}\n"


def test_the_join_token_cannot_take_a_node_and_a_restarted_agent_keeps_it(
    secret_cluster: Cluster, api: Any, owner: User
) -> None:
    # Room for an agent restart (a Python start on a busy machine) before the node is lost.
    secret_cluster.env["BERTH_HEARTBEAT_TIMEOUT"] = "60"
    real = secret_cluster.agent("iso-b")
    secret_cluster.scheduler()
    client = api(owner)
    job_id = submit(client, one_task("long", "echo begin; sleep 4; echo end"))
    wait_for(lambda: job_state(job_id) == JobState.RUNNING, what="the job to run")
    before = Node.objects.get(name="iso-b").token_hash

    impostor = APIClient().post(
        "/api/v1/agent/register/",
        {"name": "iso-b", "cpu": "64", "memory": "1Ti"},
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {JOIN}",
        HTTP_BERTH_AGENT_PROTOCOL=str(PROTOCOL),  # an up-to-date impostor
    )
    assert impostor.status_code == 409 and "iso-b" in str(impostor.json()), impostor.content
    assert Node.objects.get(name="iso-b").token_hash == before

    # The real agent restarts (its task goes on): it re-registers with its own token and
    # re-adopts the task, which finishes on the same attempt with all its output.
    os.killpg(real.pid, signal.SIGTERM)
    real.wait(timeout=10)
    secret_cluster.agent("iso-b")
    wait_for(lambda: job_state(job_id) == JobState.SUCCEEDED, what="the re-adopted job")
    node = Node.objects.get(name="iso-b")
    assert node.token_hash == before
    assert Event.objects.filter(node=node, reason="Reregistered").exists()
    task = Task.objects.get(job_id=job_id)
    assert task.attempt == 0 and task.exit_code == 0
    wait_for(lambda: output(client, job_id) == "begin\nend\n", what="all of its output")
