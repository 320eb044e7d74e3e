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


def test_it_lists_what_each_queue_holds_its_users_to(owner, signed_in):
    Queue.objects.create(
        name="interactive", max_walltime=4 * 3600, max_user_running_gpus=2,
        max_user_running_cpus=8000, max_user_pending_jobs=100, user_limits_exempt_staff=True,
        interactive_idle_minutes=0, interactive_gpu_idle_minutes=30, gpu_sharing=["mps"],
    )  # fmt: skip
    html = signed_in(owner).get("/queues/").content.decode()
    row = html.split('id="queue-rules-interactive">', 1)[1].split("</tr>", 1)[0]
    cells = [cell.split("</td>")[0] for cell in row.split("<td")[1:]]
    cells = [cell.split(">", 1)[1] for cell in cells]
    assert cells == ["interactive", "4:00:00", "2", "8", "-", "100", "yes", "never", "30 min",
                     "mps"]  # fmt: skip
    default = html.split('id="queue-rules-default">', 1)[1].split("</tr>", 1)[0]
    assert "60 min" in default and "any" in default  # the defaults: 60 min, every mode
