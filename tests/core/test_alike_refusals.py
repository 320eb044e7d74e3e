"""Backfill refuses alike jobs together (issue #21, "Fast"): a job like one refused before
(same pending task shape, queue, gang size, owner where per-user limits apply, and on the
same side of the reservation's start) is refused as that one was while nothing that decides
it changed. Every property runs a cycle with and without it and needs the same binds,
evictions, statuses (code, message, node reasons in order, estimated start) and failures.

The clusters here have many alike jobs (copies of a few templates that differ in owner,
priority, age and walltime), queues with a capability or per-user limits, fair-share factors,
and running work from an earlier cycle to preempt, reserve around and backfill next to.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import backfill as backfill_module
from scheduler.core.cycle import CycleResult, run_actions, run_cycle
from scheduler.core.model import JobInfo, QueueInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import Session
from tests.core.builders import NOW, job, node
from tests.core.test_properties import (
    CONFIGS,
    FAST,
    LIMITED_QUEUES,
    OWNERS,
    QUEUES,
    _apply,
    random_node,
)

# Queues whose capability binds: a refusal there also depends on what was bound since.
CAPPED_QUEUES = [
    QueueInfo("default", weight=1, capability=Resources(6000, 64 << 30, 3)),
    QueueInfo("research", weight=2, capability=Resources(3000, 16 << 30, 2), max_user_jobs=2),
]


def _template(draw: st.DrawFn) -> dict[str, Any]:
    replicas = draw(st.integers(1, 3))
    return {
        "gpu": draw(st.integers(0, 3)),
        "cpu": draw(st.sampled_from([0.5, 1, 2, 4])),
        "memory_gi": draw(st.integers(1, 8)),
        "replicas": replicas,
        "min_available": draw(st.integers(1, replicas)),
        "queue": draw(st.sampled_from(["default", "research"])),
        "selector": draw(st.sampled_from([{}, {}, {"zone": "a"}, {"zone": "c"}])),
    }


def _copies(draw: st.DrawFn, first_id: int) -> list[JobInfo]:
    """A few templates, each copied a few times with its own owner, priority, age and
    walltime (what the alike key leaves out, or only asks about through the reservation)."""
    jobs: list[JobInfo] = []
    for _ in range(draw(st.integers(1, 4))):
        template = _template(draw)
        for _ in range(draw(st.integers(1, 6))):
            id = first_id + len(jobs)
            jobs.append(
                job(
                    id,
                    **template,
                    priority=draw(st.integers(0, 2)),
                    walltime=draw(st.sampled_from([None, 50.0, 300.0, 2000.0])),
                    preemptible=draw(st.booleans()),
                    created_at=float(draw(st.integers(0, 3)) * 1000 + id),
                    owner=draw(st.sampled_from(OWNERS)),
                )
            )
    return jobs


@st.composite
def alike_clusters(draw: st.DrawFn) -> Snapshot:
    states = ["Ready", "Ready", "Ready", "Cordoned"]
    nodes = [random_node(draw, i, states) for i in range(draw(st.integers(1, 6)))]
    queues = draw(st.sampled_from([QUEUES, LIMITED_QUEUES, CAPPED_QUEUES]))
    first = Snapshot(NOW - 500, nodes, queues, _copies(draw, 1))
    running = _apply(first, run_cycle(first), started=NOW - 500)
    usage = {o: draw(st.sampled_from([0.0, 10.0, 1e6])) for o in OWNERS}
    return Snapshot(NOW, nodes, queues, running + _copies(draw, 100), usage)


def _decide(snap: Snapshot, config: SchedulingPolicy, together: bool, explain: bool) -> Any:
    session = Session(snap, config, default_plugins(config), explain=explain)
    session.alike_refusals = together
    result = run_actions(session)
    failures = sorted(
        (i, f.code, f.message, f.blocked_by_resources, list(f.node_reasons.items()))
        for i, f in session.failures.items()
    )
    return _outcome(result), failures


def _outcome(result: CycleResult) -> tuple[Any, ...]:
    statuses = sorted(
        (i, s.code, s.message, list(s.node_reasons.items()), s.estimated_start)
        for i, s in result.pending.items()
    )
    return result.binds, result.evictions, statuses


@FAST
@given(alike_clusters(), CONFIGS, st.booleans())
def test_alike_jobs_refused_together_decide_as_one_by_one(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    assert _decide(snap, config, True, explain) == _decide(snap, config, False, explain)


def test_the_refusal_is_not_reused_once_the_capability_is_reached() -> None:
    """Two alike jobs refused around the reservation, a third of the same shape refused
    only after a job between them took the queue to its capability: the capability's refusal
    (not the second's) is what it gets."""
    queues = [QueueInfo("default", weight=1, capability=Resources(3000, 64 << 30, 9))]
    nodes = [node("n0", gpus=4, cpu=4, memory_gi=64)]
    holder = job(1, gpu=4, created_at=1.0)
    running = job(2, gpu=2, running_on=[("n0", (0, 1))], walltime=100.0)
    jobs = [running, holder]
    # Alike 2-GPU jobs that run past the reservation's start: refused around it.
    jobs += [job(i, gpu=2, walltime=5000.0, created_at=float(i)) for i in (3, 4)]
    # A CPU-only job that fits in the spare, taking the queue to its capability.
    jobs.append(job(5, cpu=2, created_at=5.0, walltime=5000.0))
    jobs.append(job(6, gpu=2, walltime=5000.0, created_at=6.0))
    snap = Snapshot(NOW, nodes, queues, jobs)
    config = SchedulingPolicy.easy()
    together = _decide(snap, config, True, True)
    assert together == _decide(snap, config, False, True)
    statuses = {s[0]: s[1] for s in together[0][2]}
    assert statuses[6] == "QueueQuota"


def test_alike_refusals_skip_trying_nodes(monkeypatch: Any) -> None:
    """With many alike jobs waiting behind a reservation, nodes are tried once per shape,
    not once per job."""
    nodes = [node(f"n{i}", gpus=2, cpu=8) for i in range(3)]
    running = [job(i, gpu=2, running_on=[(f"n{i}", (0, 1))], walltime=100.0) for i in range(3)]
    holder = job(10, gpu=2, replicas=3, created_at=1.0)
    waiting = [job(i, gpu=1, walltime=5000.0, created_at=float(i)) for i in range(11, 61)]
    snap = Snapshot(NOW, nodes, [QueueInfo("default")], running + [holder] + waiting)
    tried: list[int] = []
    kept = backfill_module._Backfill._try

    def counting(self: Any, job: JobInfo, *args: Any) -> None:
        tried.append(job.id)
        kept(self, job, *args)

    monkeypatch.setattr(backfill_module._Backfill, "_try", counting)
    config = SchedulingPolicy.easy()
    together = _decide(snap, config, True, True)
    assert len(tried) == 1
    assert together == _decide(snap, config, False, True)
    assert len(tried) == 1 + len(waiting)
