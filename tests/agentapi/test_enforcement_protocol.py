"""The server's side of enforcement: a node says what it enforces (and runs nothing when it
cannot), start orders carry the requests to enforce, an OutOfMemory end moves the job, and
what a task used is stored with its usage record."""

from __future__ import annotations

import pytest

from scheduler.lifecycle import sync_jobs
from scheduler.models import Event, Node, UsageRecord
from scheduler.ops.accounting import efficiency
from scheduler.states.names import JobState, NodeState
from tests.agentapi.test_protocol import JOIN, NODE, _assigned, beat, lease, register

pytestmark = pytest.mark.django_db
GI = 2**30
ENFORCING = {"mode": "required", "cgroup": "v1", "missing": [], "problem": "",
             "enforced": ["cpu", "devices", "memory", "pids", "swap", "tracking"],
             "pids_limit": 4096}  # fmt: skip


@pytest.fixture(autouse=True)
def join_token(settings):
    settings.BERTH_JOIN_TOKEN = JOIN


def test_a_node_says_what_it_enforces_and_the_api_shows_it(owner, api):
    register({**NODE, "enforcement": ENFORCING})
    node = Node.objects.get()
    assert node.enforcement == ENFORCING and node.state == NodeState.READY
    shown = api(owner).get(f"/api/v1/nodes/{node.name}/").json()
    assert shown["enforcement"]["enforced"] == ENFORCING["enforced"]


def test_a_node_that_cannot_enforce_what_it_must_is_not_ready_and_says_why(owner, api):
    problem = "cannot enforce memory: no cgroups (--enforce required: this node runs no tasks)"
    token = register({**NODE, "enforcement": {**ENFORCING, "problem": problem}}).json()["token"]
    node = Node.objects.get()
    assert node.state == NodeState.NOT_READY
    assert Event.objects.get(kind="NodeNotReady").message == problem
    lease(token, wait=0)  # its renewals keep it NotReady
    node.refresh_from_db()
    assert node.state == NodeState.NOT_READY
    assert api(owner).get(f"/api/v1/nodes/{node.name}/").json()["enforcement"]["problem"] == problem


def test_a_start_order_carries_the_requests_the_agent_enforces(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    (order,) = lease(token).json()["start"]
    assert order["resources"] == {"cpu": task.cpu, "memory": task.memory}


def _oom(task, attempt=0):
    message = "out of memory: the kernel killed it at its memory limit 1024Mi (peak 1024Mi)"
    return {"id": task.pk, "attempt": attempt, "state": "Failed", "exit_code": 137,
            "output_bytes": 0, "reason": "OutOfMemory", "message": message,
            "usage": {"peak_memory": GI, "cpu_seconds": 0.5, "memory_limit": GI}}  # fmt: skip


def test_a_task_killed_for_memory_fails_its_job_out_of_memory(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    assert beat(token, [_oom(task)]).status_code == 200
    sync_jobs()
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.FAILED, "OutOfMemory")
    assert "memory limit 1024Mi (peak 1024Mi)" in job.message
    assert Event.objects.get(kind="TaskFailed").message.startswith("main-0 ran out of memory")


def test_a_job_with_retries_restarts_after_running_out_of_memory(owner):
    token = register().json()["token"]
    job, task = _assigned(owner, Node.objects.get())
    job.max_retry = 1
    job.save()
    beat(token, [_oom(task)])
    sync_jobs()
    job.refresh_from_db()
    task.refresh_from_db()
    assert job.state == JobState.PENDING and job.retries == 1 and task.reason == ""


def test_what_a_task_used_is_stored_with_its_usage_record(owner):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    beat(token, [_oom(task)])
    record = UsageRecord.objects.get()
    assert (record.memory, record.peak_memory, record.used_cpu_seconds) == (GI, GI, 0.5)
    assert efficiency(record)["memory_percent"] == 100.0


@pytest.mark.parametrize("bad", [{"reason": "Tired"}, {"usage": {"peak_memory": -1}},
                                 {"usage": "lots"}])  # fmt: skip
def test_a_malformed_reason_or_usage_is_refused(owner, bad):
    token = register().json()["token"]
    _, task = _assigned(owner, Node.objects.get())
    answer = beat(token, [{**_oom(task), **bad}])
    assert answer.status_code == 400


def test_metrics_say_per_node_which_limits_are_enforced(staff):
    from tests.ops.test_metrics import _scrape

    register({**NODE, "enforcement": ENFORCING})
    m = _scrape(staff)
    assert m[("berth_node_enforced", (("limit", "memory"), ("node", "gpu-01")))] == 1
    assert m[("berth_node_enforced", (("limit", "devices"), ("node", "gpu-01")))] == 1
    register({**NODE, "name": "gpu-02"})  # an agent that says nothing enforces nothing
    m = _scrape(staff)
    assert m[("berth_node_enforced", (("limit", "memory"), ("node", "gpu-02")))] == 0
