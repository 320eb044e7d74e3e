"""Server side of GPU utilisation: samples ride on lease renewals, are validated whole (a bad
one is a 400 naming the field, and nothing is written), kept at most once per
BERTH_GPU_SAMPLE_SECONDS per node, and pruned after BERTH_GPU_HISTORY_SECONDS."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.models import Device, DeviceSample, Node
from scheduler.ops import gpu_history
from tests.agentapi.test_protocol import JOIN, agent, register, rows

pytestmark = pytest.mark.django_db
GI = 2**30


def sample(index: int, utilization: Any = 50, used: Any = GI, total: Any = 16 * GI) -> Any:
    return {"index": index, "utilization": utilization, "memory_used": used,
            "memory_total": total}  # fmt: skip


def lease(token: str, gpus: Any, path: str = "lease/") -> Any:
    body = {"tasks": [], "wait": 0, "usage": {"gpus": gpus}}
    return agent(token).post(f"/api/v1/agent/{path}", body, format="json")


@pytest.fixture
def token(settings: Any) -> str:
    settings.BERTH_JOIN_TOKEN = JOIN
    settings.BERTH_GPU_SAMPLE_SECONDS = 5.0
    return str(register().json()["token"])  # gpu-01 with GPUs 0 and 1


def samples() -> list[tuple[int, int, int]]:
    return list(
        DeviceSample.objects.order_by("device__index", "time").values_list(
            "device__index", "utilization", "memory_used"
        )
    )


def test_a_lease_keeps_one_sample_per_gpu_stamped_with_the_servers_clock(token: str) -> None:
    before = timezone.now()
    response = lease(token, [sample(1, 97.4, 12 * GI), sample(0, 0, 0)])
    assert response.status_code == 200, response.content
    assert samples() == [(0, 0, 0), (1, 97, 12 * GI)]
    times = set(DeviceSample.objects.values_list("time", flat=True))
    node = Node.objects.get(name="gpu-01")
    assert node.gpu_sampled_at is not None and node.gpu_sampled_at >= before
    assert times == {node.gpu_sampled_at}


def test_leases_closer_than_the_sample_interval_keep_only_the_first(token: str) -> None:
    assert lease(token, [sample(0, 10)]).status_code == 200
    assert lease(token, [sample(0, 20)]).status_code == 200  # woken by orders: renewed at once
    assert samples() == [(0, 10, GI)]
    # Once the interval has passed, the next renewal's samples count.
    Node.objects.filter(name="gpu-01").update(gpu_sampled_at=timezone.now() - timedelta(seconds=6))
    assert lease(token, [sample(0, 30)]).status_code == 200
    assert samples() == [(0, 10, GI), (0, 30, GI)]


@pytest.mark.parametrize(
    ("gpus", "field"),
    [
        ("lots", "usage.gpus"),
        ([sample(0)] * 2, "usage.gpus.1.index"),  # one sample per device
        ([sample(0), 7], "usage.gpus.1"),
        ([sample(-1)], "usage.gpus.0.index"),
        ([sample(True)], "usage.gpus.0.index"),
        ([sample(0, 101)], "usage.gpus.0.utilization"),
        ([sample(0, -0.5)], "usage.gpus.0.utilization"),
        ([sample(0, "90")], "usage.gpus.0.utilization"),
        ([sample(0, None)], "usage.gpus.0.utilization"),
        ([sample(0, used=-1)], "usage.gpus.0.memory_used"),
        ([sample(0, used=17 * GI)], "usage.gpus.0.memory_used"),  # more than it has
        ([sample(0, used=1.5)], "usage.gpus.0.memory_used"),
        ([sample(0, total=2**60)], "usage.gpus.0.memory_total"),
        ([{"index": 0}], "usage.gpus.0.utilization"),
        ([sample(0)] * 300, "usage.gpus"),
    ],
)
def test_a_bad_sample_refuses_the_lease_naming_the_field_and_writes_nothing(
    token: str, gpus: Any, field: str
) -> None:
    before = rows()
    response = lease(token, gpus)
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert rows() == before  # the lease was not even renewed
    assert not DeviceSample.objects.exists()


def test_a_sample_of_a_gpu_the_server_does_not_know_is_dropped(token: str) -> None:
    # Staff deleted GPU 1's row: the agent's samples of it must not cost the node its lease.
    Device.objects.filter(node__name="gpu-01", index=1).delete()
    assert lease(token, [sample(0, 40), sample(1, 50), sample(9, 60)]).status_code == 200
    assert samples() == [(0, 40, GI)]


def test_a_report_validates_gpu_samples_too(token: str) -> None:
    response = lease(token, [sample(0, 250)], path="report/")
    assert response.status_code == 400 and "usage.gpus.0.utilization" in response.json()
    # A good one is accepted; samples are kept from leases only.
    assert lease(token, [sample(0, 25)], path="report/").status_code == 200
    assert not DeviceSample.objects.exists()


def _aged(index: int, seconds: float) -> None:
    device = Device.objects.get(node__name="gpu-01", index=index)
    DeviceSample.objects.create(device=device, time=timezone.now() - timedelta(seconds=seconds),
                                utilization=50, memory_used=0)  # fmt: skip


def test_the_history_is_bounded_by_age(token: str, settings: Any) -> None:
    settings.BERTH_GPU_HISTORY_SECONDS = 3600
    for age in (4000, 3700, 3500, 10):
        _aged(0, age)
    _aged(1, 5000)
    assert gpu_history.prune_samples(timezone.now()) == 3
    kept = DeviceSample.objects.values_list("time", flat=True)
    assert all(timezone.now() - t < timedelta(seconds=3600) for t in kept) and len(kept) == 2


def test_the_scheduler_loop_prunes_old_samples(token: str, settings: Any, monkeypatch: Any) -> None:
    settings.BERTH_GPU_HISTORY_SECONDS = 3600
    monkeypatch.setattr(gpu_history, "_pruned_at", float("-inf"))  # as in a fresh process
    _aged(0, 7200)
    _aged(0, 60)
    report = run_scheduler_cycle()
    assert report.errors == []
    assert DeviceSample.objects.count() == 1
    # Within the next minute the loop does not delete again (one statement a minute at most).
    _aged(1, 7200)
    run_scheduler_cycle()
    assert DeviceSample.objects.count() == 2


def test_deleting_a_node_deletes_its_history(token: str) -> None:
    lease(token, [sample(0), sample(1)])
    Node.objects.get(name="gpu-01").delete()
    assert not DeviceSample.objects.exists()
