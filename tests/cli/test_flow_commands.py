"""`berth flow retry`, `berth flow resubmit` and `berth resubmit` against the real REST API
(the CLI's HTTP client is wired straight into the Django app, no server)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from scheduler.flows.controller import reconcile_flows
from scheduler.jobs.submit import create_flow, submit_job
from scheduler.models import Flow, Job

pytestmark = pytest.mark.django_db
SPEC = {"tasks": [{"name": "main", "command": "run", "resources": {"cpu": 1}}]}


def failed_flow(owner: Any) -> Flow:
    flow = create_flow(owner, {"name": "f", "steps": [
        {"name": "ok", "spec": SPEC}, {"name": "bad", "spec": SPEC},
    ]})  # fmt: skip
    reconcile_flows()
    flow.jobs.filter(step__name="ok").update(state="Succeeded", finished_at=timezone.now())
    flow.jobs.filter(step__name="bad").update(state="Failed", finished_at=timezone.now())
    reconcile_flows()
    flow.refresh_from_db()
    assert flow.state == "Failed"
    return flow


def test_flow_retry_reruns_the_failed_step(berth: Any, owner: Any) -> None:
    flow = failed_flow(owner)
    result = berth("flow", "retry", str(flow.pk))
    assert result.exit_code == 0, result.output
    assert result.output == f"flow {flow.pk}: retrying bad (Running)\n"
    again = berth("flow", "retry", str(flow.pk))
    assert again.exit_code == 1 and "only a Failed flow can be retried" in again.output


def test_flow_show_says_why_a_step_waits(berth: Any, owner: Any) -> None:
    flow = create_flow(owner, {"name": "f", "steps": [
        {"name": "a", "spec": SPEC}, {"name": "b", "spec": SPEC, "depends_on": ["a"]},
    ]})  # fmt: skip
    result = berth("flow", "show", str(flow.pk))
    assert result.exit_code == 0, result.output
    assert "waits: waiting for step a to succeed" in result.output


def test_flow_and_job_resubmit_print_the_new_ids(berth: Any, owner: Any) -> None:
    flow = failed_flow(owner)
    result = berth("flow", "resubmit", str(flow.pk))
    assert result.exit_code == 0, result.output
    new_flow = Flow.objects.exclude(pk=flow.pk).get()
    assert result.output == f"Submitted flow {new_flow.pk} (a copy of flow {flow.pk})\n"

    job = submit_job(owner, {"name": "train", **SPEC})
    result = berth("resubmit", str(job.pk))
    new_job = Job.objects.filter(name="train").exclude(pk=job.pk).get()
    assert result.output == f"Submitted job {new_job.pk} (a copy of job {job.pk})\n"
    assert berth("resubmit", "999999").exit_code == 1
