"""The node page and the job page chart GPU utilisation (the charts poll the history API;
tests/browser/test_gpu_charts.py draws them), and a finished job still names its GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.states.names import TaskState
from tests.factories import finish_task, make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_the_node_page_charts_its_gpus(owner: Any, signed_in: Any) -> None:
    make_node("gpu-01", gpus=2)
    html = signed_in(owner).get("/nodes/gpu-01/").content.decode()
    assert 'data-url="/api/v1/nodes/gpu-01/gpu-history/"' in html and 'data-window="3600"' in html
    assert "gpu-chart.js" in html and "uPlot" in html
    assert 'id="node-' in html  # its card, which the cluster pushes keep current
    # Node cards link to the node's page.
    assert 'href="/nodes/gpu-01/"' in signed_in(owner).get("/nodes/").content.decode()


def test_a_node_without_gpus_says_so_and_an_unknown_node_is_404(owner: Any, signed_in: Any) -> None:
    make_node("cpu-01")
    html = signed_in(owner).get("/nodes/cpu-01/").content.decode()
    assert "no GPUs" in html and "data-gpu-chart" not in html
    assert signed_in(owner).get("/nodes/nope/").status_code == 404


def test_the_job_page_charts_the_gpus_of_a_gpu_job_only(owner: Any, signed_in: Any) -> None:
    gpu_job = make_job(owner, "train", gpu=1)
    html = signed_in(owner).get(f"/jobs/{gpu_job.pk}/").content.decode()
    assert f'data-url="/api/v1/jobs/{gpu_job.pk}/gpu-history/"' in html
    cpu_job = make_job(owner, "prep")
    assert "data-gpu-chart" not in signed_in(owner).get(f"/jobs/{cpu_job.pk}/").content.decode()


def test_a_finished_jobs_page_still_names_its_gpus(owner: Any, signed_in: Any) -> None:
    node = make_node("gpu-01", gpus=3)
    job = make_job(owner, gpu=2)
    place(job, node, devices=2)
    finish_task(job.tasks.get(), TaskState.SUCCEEDED, exit_code=0)
    html = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert '<td class="mono">0,1</td>' in html
