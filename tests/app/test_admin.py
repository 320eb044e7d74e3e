"""The admin console: every model's pages load for staff, and the operator actions work."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.models import Flow, FlowStep, JobTemplate, Node
from scheduler.states.names import NodeState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db

MODELS = ["queue", "node", "jobtemplate", "flow", "job", "task", "allocation", "tasklog", "event"]


@pytest.fixture
def console(staff):
    client = Client()
    client.force_login(staff)
    return client


@pytest.mark.parametrize("model", MODELS)
def test_it_lists_every_model(console, owner, model):
    node = make_node("gpu-01", gpus=1)
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    template = JobTemplate.objects.create(name="t", spec={})
    flow = Flow.objects.create(name="f", owner=owner, spec={})
    FlowStep.objects.create(flow=flow, name="s", position=0, template=template)
    response = console.get(reverse(f"admin:scheduler_{model}_changelist"))
    assert response.status_code == 200


@pytest.mark.parametrize(("model", "make"), [("node", "node"), ("job", "job")])
def test_it_shows_an_objects_page_with_its_derived_state(console, owner, model, make):
    node = make_node("gpu-01", gpus=1)
    job = make_job(owner, gpu=1)
    place(job, node, devices=1)
    obj = node if make == "node" else job
    response = console.get(reverse(f"admin:scheduler_{model}_change", args=[obj.pk]))
    assert response.status_code == 200
    assert b"Running" in response.content or b"Ready" in response.content


def test_it_cordons_nodes_from_the_list(console):
    make_node("gpu-01")
    make_node("gpu-02")
    response = console.post(
        reverse("admin:scheduler_node_changelist"),
        {"action": "cordon", "_selected_action": list(Node.objects.values_list("pk", flat=True))},
    )
    assert response.status_code == 302
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.CORDONED}


def test_it_cancels_jobs_from_the_list(console, owner):
    job = make_job(owner)
    console.post(
        reverse("admin:scheduler_job_changelist"),
        {"action": "cancel", "_selected_action": [job.pk]},
    )
    job.refresh_from_db()
    assert job.requested_action == "cancel"


def test_users_without_staff_cannot_enter(owner):
    client = Client()
    client.force_login(owner)
    assert client.get(reverse("admin:scheduler_job_changelist")).status_code == 302


def test_a_nodes_page_lists_its_gpus_mig_instances_and_who_holds_them(console, owner):
    from scheduler.models import Allocation, Device, MigInstance, Task

    node = make_node("a100-01", gpus=1)
    device = Device.objects.get(node=node)
    for uuid, profile in (("MIG-aaa", "1g.10gb"), ("MIG-bbb", "3g.40gb")):
        MigInstance.objects.create(device=device, uuid=uuid, profile=profile)
    job = make_job(owner)
    place(job, node)
    task = Task.objects.get(job=job)
    Allocation.objects.create(task=task, device=device, share=142, mig="MIG-aaa")
    html = console.get(reverse("admin:scheduler_node_change", args=[node.pk])).content.decode()
    assert f"1g.10gb MIG-aaa held by {task}" in html
    assert "3g.40gb MIG-bbb" in html and "3g.40gb MIG-bbb held" not in html
