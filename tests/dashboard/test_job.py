"""The job page: ownership, tasks, reasons, output and the actions as CSRF-protected forms."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.models import Job, Task, TaskLog
from scheduler.states.names import JobState
from tests.factories import make_job, make_node, place, seed

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("who", "status"), [("owner", 200), ("teammate", 404),
                                             ("outsider", 404), ("staff", 200)])  # fmt: skip
def test_it_belongs_to_its_owner_and_staff(request, signed_in, owner, who, status):
    job = make_job(owner)
    client = signed_in(request.getfixturevalue(who))
    assert client.get(f"/jobs/{job.pk}/").status_code == status
    response = client.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == (302 if status == 200 else 404)
    assert (Job.objects.get(pk=job.pk).requested_action == "cancel") == (status == 200)
    assert client.post(f"/jobs/{job.pk}/resubmit/").status_code in ((302,) if status == 200
                                                                    else (404,))  # fmt: skip


def test_it_shows_tasks_with_node_devices_and_output(owner, signed_in):
    node = make_node("gpu-01", gpus=2)
    job = make_job(owner, "trainer", gpu=2)
    place(job, node, devices=2)
    task = Task.objects.get(job=job)
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="step 1\n")
    TaskLog.objects.create(task=task, attempt=0, offset=7, data="step 2\n")
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "gpu-01" in html and ">0,1<" in html
    assert f'id="job-{job.pk}-log-{task.pk}"' in html and "step 1\nstep 2\n" in html
    assert f'ws-connect="/ws/jobs/{job.pk}/"' in html
    assert "tasks:" in html and "name: main" in html  # the spec, as YAML


def test_a_pending_job_says_why_and_when_it_may_start(owner, signed_in):
    start = timezone.now() + timedelta(minutes=5)
    job = make_job(owner, pending_code="WaitingForResources",
                   pending_message="0/2 nodes fit: 2 insufficient gpu",
                   estimated_start_at=start)  # fmt: skip
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "Why it waits" in html and "0/2 nodes fit: 2 insufficient gpu" in html
    assert "Estimated start" in html and start.strftime("%H:%M:%S") in html


def test_actions_are_post_forms_with_csrf_and_match_the_state(owner, signed_in):
    job = make_job(owner)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert f'method="post" action="/jobs/{job.pk}/cancel/"' in html
    assert f'action="/jobs/{job.pk}/suspend/"' in html and "/resume/" not in html
    assert "csrfmiddlewaretoken" in html
    Job.objects.filter(pk=job.pk).update(state=JobState.SUSPENDED)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert f'action="/jobs/{job.pk}/resume/"' in html and "/suspend/" not in html
    seed(Job.objects.filter(pk=job.pk), state=JobState.SUCCEEDED)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "/cancel/" not in html and f'action="/jobs/{job.pk}/resubmit/"' in html


def test_an_htmx_action_returns_the_status_section_with_its_outcome(owner, signed_in):
    job = make_job(owner)
    client = signed_in(owner)
    response = client.post(f"/jobs/{job.pk}/suspend/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert f'id="job-{job.pk}-status"' in html and "suspend requested" in html
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED)
    html = client.post(f"/jobs/{job.pk}/cancel/", HTTP_HX_REQUEST="true").content.decode()
    assert 'role="alert"' in html and "nothing to cancel" in html


def test_resubmit_opens_the_new_job(owner, signed_in):
    job = make_job(owner, "again")
    response = signed_in(owner).post(f"/jobs/{job.pk}/resubmit/", HTTP_HX_REQUEST="true")
    new = Job.objects.exclude(pk=job.pk).get(name="again")
    assert response["HX-Redirect"] == f"/jobs/{new.pk}/"


def test_the_csrf_check_applies_to_actions(owner):
    job = make_job(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert Job.objects.get(pk=job.pk).requested_action == ""


def test_it_says_what_isolation_each_tasks_gpu_gives(owner, signed_in):
    node = make_node("gpu-01", gpus=2, gpu_sharing=["timeslice"])
    whole = make_job(owner, "trainer", gpu=1)
    place(whole, node, devices=1)
    shared = make_job(owner, "notebook", gpu=1)
    Task.objects.filter(job=shared).update(gpu_share=250)
    place(shared, node, devices=1)
    mig = make_job(owner, "small")
    Task.objects.filter(job=mig).update(gpu_share=142, gpu_mig="1g.10gb")
    client = signed_in(owner)
    assert "whole GPU: exclusive" in client.get(f"/jobs/{whole.pk}/").content.decode()
    assert "time-slicing: no isolation" in client.get(f"/jobs/{shared.pk}/").content.decode()
    html = client.get(f"/jobs/{mig.pk}/").content.decode()
    assert "1g.10gb" in html and "MIG instance: memory and faults isolated" in html
