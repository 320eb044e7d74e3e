"""The multi-host path exercised, not assumed (issue #22): the server and two real agents as
three hosts on this machine, each a network namespace with an address of its own on one
link (veth pairs on a bridge, bench/faults.py's Bridge and Netns).

- host `server`: `./run serve` (two workers) and `run_scheduler` beside it. PostgreSQL (the
  test database) and a private Redis are reached by their Unix sockets, which no network
  namespace hides: they stand for the database host; what crosses the link is what crosses
  it between real machines, every byte between the agents and the server.
- hosts `a` and `b`: `python -m scheduler.agent` (berth-agent, no Django, no database),
  as root, so they enforce limits and run tasks as an unprivileged account.

Leases keep their production length (10 s): a cancel that lands within two seconds was
woken across processes (scheduler -> Redis -> the worker holding the far agent's lease),
not picked up at a renewal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from bench.faults import Bridge, Netns, PrivateRedis
from bench.processes import free_port, stop_groups
from scheduler.models import Event, Job, Node, Queue, Task
from scheduler.states.names import JobState, NodeState, TaskState
from tests.e2e.conftest import ROOT, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.root]

JOIN_TOKEN = "multihost-join-token"
SECRET_KEY = "multihost-tests-only-secret-key-never-in-production-0123456789"
SMALL = {"cpu": "0.1", "memory": "32Mi"}


@dataclass
class Hosts:
    """Three hosts on one link: the server's, and two agents' (`a`, `b`)."""

    tmp: Path
    server: Netns
    agents: dict[str, Netns]
    redis: PrivateRedis
    port: int = field(default_factory=free_port)
    # Node names of this run only: an agent starting reaps the task cgroups under
    # berth-<name> it does not know, so two runs sharing a name would kill each other's tasks.
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.server.inner}:{self.port}"

    def node(self, host: str) -> str:
        return f"mh-{host}-{self.tag}"

    def start(self, host: Netns, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.tmp / f"{name}.log", "ab") as log:
            self.procs.append(subprocess.Popen(
                host.command(argv), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))  # fmt: skip

    def env(self, server: bool) -> dict[str, str]:
        kept = (k for k in os.environ if k not in ("DATABASE_URL", "REDIS_URL"))
        base = {k: os.environ[k] for k in kept if not k.startswith("BERTH_")}
        base.update({"BERTH_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1"})
        if not server:
            return base  # an agent needs no database and no Redis
        return {**base, "DATABASE_URL": socket_database_url(), "REDIS_URL": self.redis.url,
                "BERTH_SECRET_KEY": SECRET_KEY, "BERTH_ALLOWED_HOSTS": self.server.inner,
                "BERTH_DATA_DIR": str(self.tmp / "data"), "BERTH_SCHEDULER_INTERVAL": "0.2",
                "BERTH_KILL_GRACE_SECONDS": "1"}  # fmt: skip

    def up(self) -> None:
        manage = [sys.executable, str(ROOT / "manage.py")]
        self.start(self.server, "web", [sys.executable, "-m", "berth.web.serve", "--no-migrate",
                   "--host", self.server.inner, "--port", str(self.port), "--workers", "2"],
                   self.env(server=True))  # fmt: skip
        self.start(self.server, "scheduler", [*manage, "run_scheduler"], self.env(server=True))
        wait_for(self.serving, timeout=90, what=f"the web tier at {self.url}")
        for name, host in self.agents.items():
            work = self.tmp / f"agent-{name}"
            self.start(host, f"agent-{name}", [sys.executable, "-m", "scheduler.agent",
                       "--server", self.url, "--name", self.node(name), "--labels", f"host={name}",
                       "--work-dir", str(work), "--state-dir", str(work / "state"),
                       "--kill-on-exit"], self.env(server=False))  # fmt: skip

    def serving(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.tmp.glob("*.log")))  # fmt: skip


def socket_database_url() -> str:
    """The test database by PostgreSQL's Unix socket: the server's namespace has no route to
    this one's 127.0.0.1, where the server listens."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW unix_socket_directories")
        directory = cursor.fetchone()[0].split(",")[0].strip()
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{directory.replace('/', '%2F')}/{db['NAME']}"


@pytest.fixture
def hosts(transactional_db: None, tmp_path: Path) -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, veth pairs and a bridge")
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the server and the test share the test database")
    missing = [p for p in ("redis-server", "nsenter", "ip") if shutil.which(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    Queue.objects.get_or_create(name="default")  # transactional tests flush it
    # Unwound last in, first out: processes stop before Redis, namespaces and the bridge go.
    with ExitStack() as stack:
        bridge = stack.enter_context(Bridge())
        server, a, b = (stack.enter_context(Netns(bridge=bridge, host=h)) for h in (1, 2, 3))
        redis = PrivateRedis(tmp_path, unix=True)
        stack.callback(redis.stop)
        redis.start()
        cluster = Hosts(tmp=tmp_path, server=server, agents={"a": a, "b": b}, redis=redis)
        stack.callback(stop_groups, cluster.procs)
        stack.callback(lambda: print(cluster.logs()))  # pytest shows it when a test fails
        cluster.up()
        yield cluster


def api(hosts: Hosts, owner: Any) -> httpx.Client:
    token = Token.objects.create(user=owner).key
    return httpx.Client(base_url=hosts.url, timeout=10, headers={"Authorization": f"Token {token}"})


def submit(client: httpx.Client, spec: dict[str, Any]) -> int:
    response = client.post("/api/v1/jobs/", json=spec)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def both_ready(hosts: Hosts) -> bool:
    names = [hosts.node(h) for h in ("a", "b")]
    states = Node.objects.filter(name__in=names).values_list("state", flat=True)
    return list(states) == [NodeState.READY] * 2


def registered_from(name: str) -> str:
    event = Event.objects.filter(kind="NodeRegistered", node__name=name).latest("pk")
    return event.message.rsplit(" from ", 1)[-1]


def test_two_agents_on_their_own_hosts_run_one_job_and_obey_a_cancel(hosts: Hosts, owner):
    wait_for(lambda: both_ready(hosts), timeout=60, what="agents a and b to register")
    for host in ("a", "b"):
        assert registered_from(hosts.node(host)) == hosts.agents[host].inner
    client = api(hosts, owner)

    spread_job(client, hosts)
    cancel_on_the_far_agent(client)


def spread_job(client: httpx.Client, hosts: Hosts) -> None:
    """A two-task job, one task pinned to each agent: each runs where it was placed, sees its
    own host's address and the first rank's as MASTER_ADDR, and its output reaches the server."""
    say = 'echo "rank $RANK/$WORLD_SIZE at $(hostname -I | tr -d " ") master $MASTER_ADDR"'
    job_id = submit(client, {"name": "spread", "tasks": [
        {"name": f"on-{h}", "replicas": 1, "command": say, "resources": SMALL,
         "node_selector": {"host": h}} for h in ("a", "b")]})  # fmt: skip
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED, timeout=60,
             what="the spread job to succeed")  # fmt: skip
    placed = dict(Task.objects.filter(job_id=job_id).values_list("group", "node__name"))
    assert placed == {"on-a": hosts.node("a"), "on-b": hosts.node("b")}
    logs = client.get(f"/api/v1/jobs/{job_id}/logs/").json()["tasks"]
    out = {t["group"]: t["data"] for t in logs}
    for rank, host in enumerate(("a", "b")):
        assert f"rank {rank}/2 at {hosts.agents[host].inner} " in out[f"on-{host}"], out


def cancel_on_the_far_agent(client: httpx.Client) -> None:
    """A cancel kills a task running on another host within two seconds, though that
    agent's lease is held ten: the scheduler's order woke it through Redis."""
    marker = f"sleep 6{os.getpid() % 1000:03d}.25"  # a command line no other test runs
    job_id = submit(client, {"name": "long", "tasks": [
        {"name": "main", "replicas": 1, "command": marker, "resources": SMALL,
         "node_selector": {"host": "b"}}]})  # fmt: skip
    wait_for(lambda: Task.objects.filter(job_id=job_id, state=TaskState.RUNNING).exists(),
             timeout=60, what="the long task to run on b")  # fmt: skip
    wait_for(lambda: running(marker), timeout=10, what=f"`{marker}` to be running")
    time.sleep(0.5)  # the agent's start report answered; its next lease is held
    asked = time.monotonic()
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code in (200, 202)
    wait_for(lambda: not running(marker), timeout=15, what=f"`{marker}` to be killed")
    took = time.monotonic() - asked
    print(f"cancel reached the task on the far agent in {took:.2f}s")
    assert took < 2.0, f"the cancel took {took:.2f}s: the agent waited for its lease"
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.CANCELLED, timeout=15,
             what="the job to end Cancelled")  # fmt: skip


def running(command: str) -> bool:
    """Whether a process of this machine runs exactly `command`."""
    wanted = command.encode().replace(b" ", b"\0") + b"\0"
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                return True
        except OSError:
            continue  # gone meanwhile
    return False
