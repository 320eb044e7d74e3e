"""scheduler/core/fit.py, what submit refuses, agrees with the core: a job it says never fits
the cluster is NeverFits in a cycle on that cluster, and one it accepts is not."""

from __future__ import annotations

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.fit import Ask, Offer, never_fits
from scheduler.core.model import JobInfo, NodeInfo
from scheduler.core.resources import Resources
from scheduler.core.status import Code
from tests.core.builders import GI, job, node, snapshot

NODES = [node("a", gpus=4, labels={"zone": "x"}), node("b", gpus=4, cpu=16, labels={"zone": "y"})]


def offers(nodes: list[NodeInfo]) -> list[Offer]:
    return [Offer(n.name, n.allocatable, n.labels) for n in nodes]


def asks(j: JobInfo) -> list[Ask]:
    first = j.tasks[0]
    return [Ask("tasks.0", first.group, first.resources, len(j.tasks), first.node_selector)]


CASES = [
    (job(1, gpu=6), "tasks.0.resources.gpu"),
    (job(1, cpu=32), "tasks.0.resources.cpu"),
    (job(1, memory_gi=65), "tasks.0.resources.memory"),
    (job(1, gpu=1, selector={"zone": "z"}), "tasks.0.node_selector"),
    (job(1, cpu=12, selector={"zone": "x"}), "tasks.0.resources.cpu"),
    (job(1, gpu=4, replicas=3), "min_available"),
    (job(1, gpu=4, replicas=3, min_available=2), None),
    (job(1, gpu=4, replicas=2), None),
    (job(1, cpu=12), None),
]


@pytest.mark.parametrize(("waiting", "field"), CASES)
def test_submit_and_the_core_agree(waiting: JobInfo, field: str | None) -> None:
    problems = never_fits(asks(waiting), waiting.min_available, offers(NODES))
    assert list(problems) == ([field] if field else [])
    status = run_cycle(snapshot(NODES, [waiting])).pending.get(waiting.id)
    assert (status is not None and status.code == Code.NEVER_FITS) == bool(field)


def test_it_names_the_request_and_the_largest_offer() -> None:
    problems = never_fits([Ask("tasks.0", "main", Resources(gpu=6))], 1, offers(NODES))
    assert problems == {"tasks.0.resources.gpu": "6 per task requested, the largest node has 4"}
    memory = never_fits([Ask("tasks.0", "main", Resources(memory=65 * GI))], 1, offers(NODES))
    assert memory["tasks.0.resources.memory"].endswith("the largest node has 64Gi")


def test_nothing_is_refused_without_nodes() -> None:
    assert never_fits([Ask("tasks.0", "main", Resources(gpu=99))], 1, []) == {}
