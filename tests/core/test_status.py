"""Table-driven: each Status code the core produces comes out of `run_cycle` for a small
snapshot, with the node reasons counted where the code is about nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.plugins import Plugin
from scheduler.core.resources import Resources
from scheduler.core.status import Code
from tests.core.builders import GI, job, node, snapshot

FCFS = SchedulingPolicy.fcfs()
EASY = SchedulingPolicy.easy()


class RaisesFor(Plugin):
    name = "raises"

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id

    def predicate(self, session, job, task, node):  # type: ignore[no-untyped-def]
        if job.id == self.job_id:
            raise RuntimeError("plugin broke")
        return None


@dataclass
class Case:
    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    code: Code
    config: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    queues: list[QueueInfo] | None = None
    job_id: int = 2
    in_message: str = ""
    node_reasons: dict[str, int] | None = None


def busy(gpus: int = 1, node_name: str = "a", **kw: object) -> JobInfo:
    """Job 1: running, not preemptible, on `gpus` devices of node `node_name`."""
    return job(1, gpu=gpus, running_on=[(node_name, tuple(range(gpus)))], preemptible=False, **kw)  # type: ignore[arg-type]


SMALL = QueueInfo("small", capability=Resources(64_000, 512 * GI, 1))
CASES = {
    "waiting for resources": Case(
        [node("a", gpus=1)], [busy(), job(2, gpu=1)], Code.WAITING_FOR_RESOURCES, FCFS,
        node_reasons={"insufficient gpu": 1},
    ),
    "never fits: gpu per task": Case(
        [node("a", gpus=4), node("b", gpus=4)], [job(2, gpu=6)], Code.NEVER_FITS,
        in_message="insufficient gpu", node_reasons={"insufficient gpu": 2},
    ),
    "never fits: memory per task": Case(
        [node("a", gpus=1, memory_gi=64)], [job(2, memory_gi=128)], Code.NEVER_FITS,
        in_message="insufficient memory",
    ),
    "never fits: node selector": Case(
        [node("a", gpus=1), node("b", gpus=1)], [job(2, gpu=1, selector={"gpu-model": "h100"})],
        Code.NEVER_FITS, node_reasons={"node selector mismatch": 2},
    ),
    "never fits: gang larger than the empty cluster": Case(
        [node("a", gpus=4), node("b", gpus=4)], [job(2, gpu=4, replicas=3)], Code.NEVER_FITS,
        in_message="gang",
    ),
    "never fits: more than the queue's capability": Case(
        [node("a", gpus=4)], [job(2, gpu=2, queue="small")], Code.NEVER_FITS,
        queues=[QueueInfo("default"), SMALL], in_message='queue "small"',
    ),
    "queue quota": Case(
        [node("a", gpus=4)], [busy(queue="small"), job(2, gpu=1, queue="small")], Code.QUEUE_QUOTA,
        queues=[QueueInfo("default"), SMALL], in_message="at capability",
    ),
    "gang incomplete": Case(
        [node("a", gpus=4), node("b", gpus=4)], [busy(4), job(2, gpu=4, replicas=2)],
        Code.GANG_INCOMPLETE, FCFS, in_message="gang: 1/2",
    ),
    "reserved": Case([node("a", gpus=1)], [busy(), job(2, gpu=1)], Code.RESERVED, EASY),
    "reserved for other": Case(
        [node("a", gpus=2)],
        [busy(walltime=1000.0), job(2, gpu=2), job(3, gpu=1, walltime=10_000.0)],
        Code.RESERVED_FOR_OTHER, EASY, job_id=3,
    ),
    "priority (strict order)": Case(
        [node("a", gpus=2)], [busy(), job(2, gpu=2), job(3, gpu=1)], Code.PRIORITY, FCFS,
        job_id=3, in_message="job 2",
    ),
    "preempting": Case(
        [node("a", gpus=1)],
        [job(1, gpu=1, running_on=[("a", (0,))]), job(2, gpu=1, priority=50)],
        Code.PREEMPTING, in_message="preempted",
    ),
    "queue closed": Case(
        [node("a", gpus=1)], [job(2, gpu=1)], Code.QUEUE_CLOSED,
        queues=[QueueInfo("default", open=False)],
    ),
    "queue missing": Case([node("a", gpus=1)], [job(2, gpu=1, queue="gone")], Code.QUEUE_MISSING),
    "scheduler error": Case(
        [node("a", gpus=1)], [job(2, gpu=1)], Code.SCHEDULER_ERROR,
        SchedulingPolicy(extra_plugins=(RaisesFor(2),)), in_message="plugin broke",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_code_comes_out_of_run_cycle(case: Case) -> None:
    result = run_cycle(snapshot(case.nodes, case.jobs, case.queues), case.config)
    status = result.pending[case.job_id]
    assert status.code == case.code, status
    assert case.in_message in status.message
    if case.node_reasons is not None:
        assert status.node_reasons == case.node_reasons
    assert status.unresolvable == (case.code == Code.NEVER_FITS)


def test_a_job_placed_gets_no_status() -> None:
    result = run_cycle(snapshot([node("a", gpus=1)], [job(2, gpu=1)]))
    assert 2 not in result.pending


def test_jobs_waiting_behind_the_first_in_order_each_have_their_own_status() -> None:
    # The cycle's caller sets each status's estimated start (scheduler/cycle/planning.py):
    # two jobs must never hold one Status object.
    jobs = [busy(), job(2, gpu=2), job(3, gpu=1), job(4, gpu=1)]
    result = run_cycle(snapshot([node("a", gpus=2)], jobs), FCFS)
    third, fourth = result.pending[3], result.pending[4]
    assert third.code == fourth.code == Code.PRIORITY
    assert third == fourth
    assert third is not fourth
