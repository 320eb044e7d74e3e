"""The cluster page: node cards, GPUs coloured by the job holding them, totals and shares."""

from __future__ import annotations

import pytest

from scheduler.models import Queue
from scheduler.states.names import NodeState
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_it_shows_each_gpu_with_the_job_holding_it(owner, signed_in):
    node = make_node("gpu-01", gpus=2)
    job = make_job(owner, "trainer", gpu=1)
    place(job, node, devices=1)
    html = signed_in(owner).get("/").content.decode()
    assert f'id="node-{node.pk}"' in html and "gpu-01" in html
    assert f'href="/jobs/{job.pk}/"' in html
    assert f"held by job {job.pk} trainer of alice in queue default" in html
    assert "GPU 1 free" in html
    assert 'ws-connect="/ws/cluster/"' in html


def test_it_makes_unusable_nodes_stand_out(owner, signed_in):
    make_node("a-ok")
    make_node("b-lost", state=NodeState.NOT_READY)
    make_node("c-cordoned", state=NodeState.CORDONED)
    make_node("d-draining", state=NodeState.DRAINING)
    html = signed_in(owner).get("/").content.decode()
    for state in ("state-ready", "state-notready", "state-cordoned", "state-draining"):
        assert state in html
    assert "1 not ready" in html and "1 cordoned" in html and "1 draining" in html


def test_it_shows_queue_use_against_weighted_share(owner, signed_in):
    Queue.objects.create(name="research", weight=3)
    node = make_node("gpu-01", gpus=2)
    place(make_job(owner, gpu=2), node, devices=2)
    html = signed_in(owner).get("/").content.decode()
    assert "default uses 100% against a fair share of 100%" in html  # research is idle
    assert "research uses 0% against a fair share of 75%" in html
    assert "<b>2<small>/2</small></b><span>GPUs in use" in html


def test_it_shows_other_users_jobs_on_gpus_as_the_shared_cluster_view(owner, outsider, signed_in):
    node = make_node("gpu-01", gpus=1)
    place(make_job(outsider, "theirs", gpu=1), node, devices=1)
    assert "theirs" in signed_in(owner).get("/").content.decode()


def test_it_shows_a_shared_gpus_occupants_each_with_its_share(owner, teammate, signed_in):
    from scheduler.models import Allocation, Device

    node = make_node("gpu-01", gpus=2, gpu_sharing=["timeslice"])
    device = Device.objects.get(node=node, index=0)
    jobs = [make_job(owner, "notebook"), make_job(teammate, "serve")]
    for job, share in zip(jobs, (250, 500), strict=True):
        place(job, node)
        Allocation.objects.create(device=device, task=job.tasks.get(), share=share)
    html = signed_in(owner).get("/").content.decode()
    assert "GPU 0 shared by 2 jobs, 0.25 free" in html
    assert f"job {jobs[0].pk} notebook holds 0.25 of GPU 0" in html
    assert f"job {jobs[1].pk} serve holds 0.5 of GPU 0" in html
    assert f'href="/jobs/{jobs[1].pk}/"' in html
    assert "GPU 1 free" in html
    assert "<b>0.75<small>/2</small></b><span>GPUs in use" in html
