"""The protocol's GPU sharing fields (scheduler/agent/wire.py): a registration offers its
sharing modes; a start order says what the task holds of each device, whole when an older
server says nothing."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.agent.wire import Registration, StartOrder

ORDER: dict[str, Any] = {"id": 7, "attempt": 0, "devices": [0, 3]}


def test_a_start_order_carries_shares_and_gpu_memory() -> None:
    order = StartOrder.from_json({**ORDER, "devices": [2], "shares": [0.25], "gpu_memory": 2**30})
    assert (order.devices, order.shares, order.gpu_memory) == ([2], [0.25], 2**30)
    assert StartOrder.from_json(order.to_json()) == order


@pytest.mark.parametrize(
    "shares", [None, [0.5], [0.5, "x"], [0.5, 1.5], [0, 1], [True, 1.0], "1,1"]
)
def test_shares_an_agent_cannot_trust_read_as_whole_devices(shares: Any) -> None:
    order = StartOrder.from_json({**ORDER, "shares": shares})
    assert order.shares == [1.0, 1.0] and order.gpu_memory is None


def test_whole_gpu_orders_say_whole_shares() -> None:
    body = StartOrder.from_json(ORDER).to_json()
    assert body["shares"] == [1.0, 1.0] and "gpu_memory" not in body


def test_a_registration_offers_its_sharing_modes_only_when_it_has_some() -> None:
    base = Registration("n", 1000, 2**30, {}, [], "h", "v")
    assert "gpu_sharing" not in base.to_json()
    offered = Registration("n", 1000, 2**30, {}, [], "h", "v", None, ["timeslice"])
    assert offered.to_json()["gpu_sharing"] == ["timeslice"]
