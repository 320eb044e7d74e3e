"""The node page says what its agent enforces on its tasks, and why a node runs nothing."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Node
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def test_the_node_page_says_what_is_enforced_and_why_a_node_runs_nothing(
    owner: Any, signed_in: Any
) -> None:
    make_node("gpu-01")
    Node.objects.filter(name="gpu-01").update(enforcement={
        "mode": "required", "cgroup": "v1", "enforced": ["cpu", "memory", "pids"],
        "missing": [], "problem": ""})  # fmt: skip
    html = signed_in(owner).get("/nodes/gpu-01/").content.decode()
    assert "cgroup v1: cpu, memory, pids" in html and "Runs no tasks" not in html
    make_node("gpu-02")
    Node.objects.filter(name="gpu-02").update(enforcement={"problem": "cannot enforce memory"})
    html = signed_in(owner).get("/nodes/gpu-02/").content.decode()
    assert "Runs no tasks: cannot enforce memory" in html
    make_node("gpu-03")
    assert (
        "Requests are not enforced there" in signed_in(owner).get("/nodes/gpu-03/").content.decode()
    )
