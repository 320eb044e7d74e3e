"""Which way each task holds its GPU and what that isolates, as the REST job detail and
`berth show` say it (one wording: scheduler/agent/sharemodes.py): a MIG instance, a share
under MPS or time-slicing, a whole GPU, no GPU. The CLI runs against the real REST API (its
HTTP client wired straight into the Django app: the `berth` fixture of tests/cli/conftest.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.agent.sharemodes import LABELS, mode_of
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Device, MigInstance, Node
from tests.factories import GI, make_node

pytestmark = pytest.mark.django_db


def _submit(berth: Any, *args: str) -> int:
    done = berth("submit", *args, "--cpu", "0.1", "--mem", "16Mi", "--json", "--", "true")
    assert done.exit_code == 0, done.output
    return int(json.loads(done.output)["id"])


@pytest.fixture
def placed(berth: Any) -> dict[str, int]:
    make_node("gpu-01", gpus=3, cpu=8000, memory=32 * GI, gpu_sharing=["mig", "timeslice"])
    Device.objects.update(memory=16 * GI)
    MigInstance.objects.create(device=Device.objects.get(index=0), uuid="MIG-a", profile="1g.10gb")
    jobs = {
        "mig": _submit(berth, "--gpus", "1g.10gb"),
        "share": _submit(berth, "--gpus", "0.5"),
        "whole": _submit(berth, "--gpus", "1"),
        "cpu": _submit(berth),
    }
    run_scheduler_cycle()
    return jobs


def test_the_job_detail_says_how_each_task_holds_its_gpu(api, owner, placed):
    def holding(job_id: int) -> Any:
        return api(owner).get(f"/api/v1/jobs/{job_id}/").json()["tasks"][0]["gpu_sharing"]

    assert holding(placed["mig"]) == {"mode": "mig", "isolation": LABELS["mig"]}
    assert holding(placed["share"]) == {"mode": "timeslice", "isolation": LABELS["timeslice"]}
    assert holding(placed["whole"]) == {"mode": "exclusive", "isolation": LABELS["exclusive"]}
    assert holding(placed["cpu"]) is None
    Node.objects.update(gpu_sharing=["mig", "mps"])  # the agent, restarted with MPS
    assert holding(placed["share"]) == {"mode": "mps", "isolation": LABELS["mps"]}


def test_show_prints_the_isolation_each_task_got(berth, placed):
    said = {name: berth("show", str(job_id)).output for name, job_id in placed.items()}
    assert "gpu: main-0 MIG instance: memory and faults isolated" in said["mig"]
    assert "gpu: main-0 time-slicing: no isolation" in said["share"]
    assert "gpu: main-0 whole GPU: exclusive" in said["whole"]
    assert "gpu: main-0" not in said["cpu"]


def test_the_words_are_those_the_issue_promises():
    assert "memory and faults isolated" in LABELS["mig"]
    assert "limits enforced, faults shared" in LABELS["mps"]
    assert "no isolation" in LABELS["timeslice"] and "exclusive" in LABELS["exclusive"]
    # the agent's rule: MPS wherever offered, else time-slicing; MIG for an instance
    assert mode_of(0.5, "", ["mps", "timeslice"]) == "mps"
    assert mode_of(0.5, "", ["timeslice"]) == "timeslice"
    assert mode_of(0.142, "MIG-a", ["mig"]) == "mig" and mode_of(1, "", []) == "exclusive"
    assert mode_of(0.5, "", ["mig"]) == ""


@pytest.mark.parametrize("told_by", ["lease", "report"])
def test_a_started_share_keeps_the_mode_its_agent_applied(api, owner, settings, told_by):
    """The label says what the task got, not what its node offers now: an agent restarted
    with other modes does not change how a running task was started."""
    from scheduler.models import Job, Task
    from tests.agentapi.test_protocol import JOIN, NODE, agent, register

    settings.BERTH_JOIN_TOKEN = JOIN
    token = register({**NODE, "gpu_sharing": ["timeslice"]}).json()["token"]
    spec = {"name": "half", "tasks": [{"name": "main", "command": "true",
                                       "resources": {"gpu": 0.5}}]}  # fmt: skip
    submitted = api(owner).post("/api/v1/jobs/", spec, format="json")
    assert submitted.status_code == 201, submitted.json()
    run_scheduler_cycle()
    task = Task.objects.get(job_id=submitted.json()["id"])
    running = {"id": task.pk, "attempt": 0, "state": "Running", "output_bytes": 0,
               "exit_code": None, "gpu_mode": "timeslice"}  # fmt: skip
    path = "/api/v1/agent/lease/" if told_by == "lease" else "/api/v1/agent/report/"
    body = {"tasks": [running], "wait": 0} if told_by == "lease" else {"tasks": [running]}
    assert agent(token).post(path, body, format="json").status_code == 200
    assert Task.objects.get(pk=task.pk).gpu_mode == "timeslice"
    Node.objects.update(gpu_sharing=["mps", "timeslice"])  # the agent, restarted with MPS
    detail = api(owner).get(f"/api/v1/jobs/{task.job_id}/").json()["tasks"][0]["gpu_sharing"]
    assert detail == {"mode": "timeslice", "isolation": LABELS["timeslice"]}
    # A bad mode is refused whole, naming the field.
    refused = agent(token).post(path, {**body, "tasks": [{**running, "gpu_mode": "magic"}]},
                                format="json")  # fmt: skip
    assert refused.status_code == 400 and "tasks.0.gpu_mode" in json.dumps(refused.json())
    assert Job.objects.get(pk=task.job_id).state in ("Running", "Pending")
