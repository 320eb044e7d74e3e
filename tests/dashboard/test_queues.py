"""The queues page: weights, shares, running and pending counts."""

from __future__ import annotations

import pytest

from scheduler.models import Queue
from tests.factories import make_job, make_node, place

pytestmark = pytest.mark.django_db


def test_it_shows_each_queue_with_its_share_and_jobs(owner, signed_in):
    Queue.objects.create(name="research", weight=3, capability={"gpu": 4}, open=False)
    node = make_node("gpu-01", gpus=4)
    place(make_job(owner, gpu=1), node, devices=1)
    make_job(owner, "waiting", queue="research")
    html = signed_in(owner).get("/queues/").content.decode()
    assert 'id="queues-table"' in html and 'ws-connect="/ws/cluster/"' in html
    assert "research uses 0% against a fair share of 75%" in html
    assert "default uses 25% against a fair share of 25%" in html
    assert "gpu=4" in html and "closed" in html
