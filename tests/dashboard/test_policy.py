"""The priority policy in the pages: the submit form and resubmit refuse a priority above the
queue's cap for non-staff users, and the queues page shows each queue's cap."""

from __future__ import annotations

import pytest

from scheduler.models import Job, Queue
from tests.factories import make_job

pytestmark = pytest.mark.django_db

REFUSAL = 'at most 0 in queue "default" for non-staff users, got 1000000'
SPEC = "name: urgent\npriority: 1000000\ntasks:\n- command: 'true'\n"


def test_the_submit_form_refuses_a_priority_above_the_cap(owner, signed_in):
    response = signed_in(owner).post("/submit/", {"kind": "job", "spec": SPEC})
    assert response.status_code == 400
    html = response.content.decode()
    assert "<code>priority</code>: " + REFUSAL.replace('"', "&quot;") in html
    assert not Job.objects.exists()


def test_staff_submit_any_priority_from_the_form(staff, signed_in):
    response = signed_in(staff).post("/submit/", {"kind": "job", "spec": SPEC})
    assert response.status_code == 302
    assert Job.objects.get(name="urgent").priority == 1_000_000


def test_resubmitting_above_a_lowered_cap_says_why_instead_of_failing(owner, staff, signed_in):
    job = make_job(owner, "again", priority=5)
    job.spec["priority"] = 5
    job.save()  # accepted while the cap was 5; the cap is 0 now
    response = signed_in(owner).post(f"/jobs/{job.pk}/resubmit/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'role="alert"' in html and "cannot resubmit: priority: at most 0" in html
    assert Job.objects.count() == 1

    # Staff may resubmit it as it was; the new job is still the owner's.
    signed_in(staff).post(f"/jobs/{job.pk}/resubmit/", HTTP_HX_REQUEST="true")
    new = Job.objects.exclude(pk=job.pk).get()
    assert (new.owner, new.priority) == (owner, 5)


def test_the_queues_page_shows_the_cap(owner, signed_in):
    Queue.objects.create(name="urgent", max_user_priority=250)
    html = signed_in(owner).get("/queues/").content.decode()
    assert "user priority ≤" in html
    assert "<td>250</td>" in html


def test_staff_set_the_cap_in_the_admin_within_the_priority_range(staff, signed_in):
    queue = Queue.objects.get(name="default")
    form = {"name": "default", "weight": "1", "capability": "null", "reclaimable": "on",
            "priority": "0", "open": "on", "default_cpu": "1000",
            "default_memory": str(1 << 30), "interactive_idle_minutes": "60",
            "interactive_gpu_idle_minutes": "60"}  # fmt: skip
    url = f"/admin/scheduler/queue/{queue.pk}/change/"
    too_big = signed_in(staff).post(url, {**form, "max_user_priority": "1000001"})
    assert too_big.status_code == 200  # the form again, with the error
    assert "less than or equal to 1000000" in too_big.content.decode()
    assert Queue.objects.get(pk=queue.pk).max_user_priority == 0
    saved = signed_in(staff).post(url, {**form, "max_user_priority": "100"})
    assert saved.status_code == 302
    assert Queue.objects.get(pk=queue.pk).max_user_priority == 100
