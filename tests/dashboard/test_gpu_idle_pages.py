"""A job flagged for holding GPUs idle (scheduler/ops/gpu_idle.py) stands out on its page, and
the cluster page lists every such job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.models import Job
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def idle_job(owner: Any, name: str = "sleepy") -> Job:
    node = make_node(f"node-{name}", gpus=1)
    job = make_job(owner, name, gpu=1)
    place(job, node, devices=1)
    Job.objects.filter(pk=job.pk).update(gpu_idle_since=timezone.now() - timedelta(minutes=42))
    return job


def test_the_job_page_says_its_gpus_are_idle(owner: Any, signed_in: Any) -> None:
    job = idle_job(owner)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert f'id="job-{job.pk}-gpu-idle"' in html and "GPUs idle" in html
    busy = make_job(owner, "busy", gpu=1)
    place(busy, make_node("node-busy", gpus=1), devices=1)
    assert "gpu-idle" not in signed_in(owner).get(f"/jobs/{busy.pk}/").content.decode()


def test_the_cluster_page_lists_the_idle_gpu_jobs(owner: Any, signed_in: Any) -> None:
    job = idle_job(owner)
    make_job(owner, "busy", gpu=1)
    html = signed_in(owner).get("/").content.decode()
    assert 'aria-label="jobs holding GPUs idle"' in html
    section = html[html.index('aria-label="jobs holding GPUs idle"') :].split("</div>")[0]
    assert f'href="/jobs/{job.pk}/"' in section and "sleepy" in section and "alice" in section
    assert "busy" not in section


def test_the_cluster_page_says_nothing_with_no_gpu_idle(owner: Any, signed_in: Any) -> None:
    make_job(owner, "busy", gpu=1)
    assert "jobs holding GPUs idle" not in signed_in(owner).get("/").content.decode()
