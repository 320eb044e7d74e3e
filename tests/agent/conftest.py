"""Agents in these tests run as root here: whatever cgroups their tasks got are gone after
each test (killed and removed), so a failing test leaves nothing behind on the machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.agent.fence import Fence


@pytest.fixture(autouse=True)
def _no_cgroups_left() -> Iterator[None]:
    yield
    fence = Fence(mode="best-effort", base_name="berth-test-node")
    fence.setup()
    fence.reap(set())
    fence.close()
