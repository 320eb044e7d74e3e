"""Table-driven tests of the core's actions and plugins: inputs in, binds/evictions/reasons out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.core.cycle import run_cycle
from scheduler.core.model import QueueInfo, SchedulingPolicy
from scheduler.core.plugins import Plugin
from scheduler.core.resources import Resources
from tests.core.builders import NOW, job, node, placed_jobs, snapshot

ROOT = Path(__file__).resolve().parents[2]


def test_it_imports_and_runs_with_django_absent():
    code = (
        "import sys; sys.modules['django'] = None\n"
        "from scheduler.core.cycle import run_cycle\n"
        "from scheduler.core.model import NodeInfo, Snapshot, QueueInfo, JobInfo, TaskInfo\n"
        "from scheduler.core.resources import Resources\n"
        "t = TaskInfo(1, 'main', 0, Resources(1000, 1, 0))\n"
        "j = JobInfo(1, 'j', 'default', 'u', 0, True, 1, 0.0, None, 'Pending', [t])\n"
        "n = NodeInfo('n', Resources(2000, 10, 0))\n"
        "r = run_cycle(Snapshot(0.0, [n], [QueueInfo('default')], [j]))\n"
        "assert [b.node for b in r.binds] == ['n']\n"
        "import scheduler.core.actions, scheduler.core.plugins, scheduler.core.session\n"
        "assert 'django' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("nodes", "jobs", "expected_nodes"),
    [
        # binpack: the partly used node fills first
        (
            [node("a", gpus=4), node("b", gpus=4)],
            [job(1, gpu=1, running_on=[("b", (0,))]), job(2, gpu=1)],
            {2: {"b"}},
        ),
        # a multi-GPU gang stays on as few nodes as possible
        (
            [node("a", gpus=8), node("b", gpus=8), node("c", gpus=8)],
            [job(1, gpu=2, replicas=4)],
            {1: {"a"}},
        ),
        # node selector picks the labelled node
        (
            [node("a", gpus=1), node("b", gpus=1, labels={"gpu-model": "h100"})],
            [job(1, gpu=1, selector={"gpu-model": "h100"})],
            {1: {"b"}},
        ),
        # cordoned and not-ready nodes take nothing
        (
            [
                node("a", gpus=1, state="Cordoned"),
                node("b", gpus=1, state="NotReady"),
                node("c", gpus=1),
            ],
            [job(1, gpu=1)],
            {1: {"c"}},
        ),
    ],
)
def test_it_places_jobs_on_the_expected_nodes(nodes, jobs, expected_nodes):
    result = run_cycle(snapshot(nodes, jobs))
    got: dict[int, set[str]] = {}
    for bind in result.binds:
        got.setdefault(bind.job_id, set()).add(bind.node)
    assert got == expected_nodes


def test_it_spreads_when_asked():
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    jobs = [job(1, gpu=1, running_on=[("a", (0,))]), job(2, gpu=1)]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy(node_order="spread"))
    assert [b.node for b in result.binds] == ["b"]


def test_it_picks_free_device_indices_contiguously():
    nodes = [node("a", gpus=4)]
    jobs = [job(1, gpu=1, running_on=[("a", (1,))]), job(2, gpu=2)]
    (bind,) = run_cycle(snapshot(nodes, jobs)).binds
    assert bind.devices == (2, 3)


def test_it_places_a_gang_all_or_nothing():
    nodes = [node("a", gpus=2), node("b", gpus=1)]
    result = run_cycle(snapshot(nodes, [job(1, gpu=2, replicas=2)]), SchedulingPolicy.fcfs())
    assert result.binds == []
    assert result.pending[1].message.startswith("gang: 1/2 tasks placeable")


def test_it_starts_a_gang_of_min_available_and_places_extras_best_effort():
    nodes = [node("a", gpus=3)]
    result = run_cycle(snapshot(nodes, [job(1, gpu=1, replicas=4, min_available=2)]))
    assert len(result.binds) == 3


@pytest.mark.parametrize("config", [SchedulingPolicy(), SchedulingPolicy.easy()])
def test_it_places_every_fitting_job_after_one_with_an_impossible_selector(config):
    """Volcano's backfill stopped at the first job that failed a predicate."""
    nodes = [node(f"n{i}", gpus=2) for i in range(2)]
    jobs = [job(1, gpu=1, selector={"gpu-model": "h100"}, priority=100)] + [
        job(i, gpu=1) for i in range(2, 6)
    ]
    result = run_cycle(snapshot(nodes, jobs), config)
    assert placed_jobs(result) == {2, 3, 4, 5}
    assert result.pending[1].message == "0/2 nodes fit: 2 node selector mismatch"


def test_it_backfills_every_fitting_job_after_an_impossible_one():
    """The same in the backfill action itself: jobs behind a blocked one, the first of which
    can never run, must all be considered."""
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    jobs = [
        job(1, gpu=2, running_on=[("a", (0, 1))], walltime=1000),
        job(2, gpu=4, replicas=1, walltime=100),  # 4 GPUs > any node: never, not reserved
        job(3, gpu=2, replicas=2, priority=5),  # blocked by resources: takes the reservation
        job(4, gpu=1, selector={"zone": "mars"}),  # impossible
        job(5, gpu=1, walltime=10),  # short: fits before the reservation
        job(6, gpu=1, walltime=10),
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.easy())
    assert placed_jobs(result) == {5, 6}
    assert result.pending[3].code == "Reserved"
    assert result.pending[4].message == "0/2 nodes fit: 2 node selector mismatch"


class RaisesFor(Plugin):
    name = "raises"

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id

    def predicate(self, session, job, task, node):
        if job.id == self.job_id:
            raise RuntimeError("plugin broke")
        return None


@pytest.mark.parametrize("base", [SchedulingPolicy(), SchedulingPolicy.easy()])
def test_it_places_every_other_job_when_a_plugin_raises_for_one(base):
    config = SchedulingPolicy(actions=base.actions, extra_plugins=(RaisesFor(1),))
    nodes = [node("a", gpus=4)]
    jobs = [job(1, gpu=1, priority=100), job(2, gpu=1), job(3, gpu=1)]
    result = run_cycle(snapshot(nodes, jobs), config)
    assert placed_jobs(result) == {2, 3}
    assert result.pending[1].code == "SchedulerError"
    assert "plugin broke" in result.pending[1].message


@pytest.mark.parametrize(
    ("nodes", "the_job", "queues", "reason", "message"),
    [
        (
            [node(f"g{i}", gpus=1, labels={"zone": "a"}) for i in range(8)]
            + [node(f"h{i}", gpus=8, labels={"zone": "b"}) for i in range(4)],
            job(1, gpu=2, selector={"zone": "a"}),
            None,
            "NeverFits",
            "0/12 nodes fit: 8 insufficient gpu, 4 node selector mismatch",
        ),
        (
            [node("a", gpus=8)],
            job(1, gpu=1, queue="research"),
            [QueueInfo("research", capability=Resources(gpu=0, cpu=10**9, memory=10**15))],
            "NeverFits",
            'needs gpu 1, more than queue "research" may ever hold (0)',
        ),
        (
            [node("a", gpus=8)],
            job(1, gpu=1, queue="closed"),
            [QueueInfo("closed", open=False)],
            "QueueClosed",
            'queue "closed" is closed',
        ),
        (
            [node("a", gpus=1), node("b", gpus=1), node("c", gpus=1), node("d")],
            job(1, gpu=1, replicas=4),
            None,
            "NeverFits",
            "gang: 3/4 tasks placeable; 0/4 nodes fit: 4 insufficient gpu",
        ),
    ],
)
def test_it_explains_why_a_job_waits(nodes, the_job, queues, reason, message):
    result = run_cycle(snapshot(nodes, [the_job], queues), SchedulingPolicy.fcfs())
    assert (result.pending[1].code, result.pending[1].message) == (reason, message)


def test_it_reports_queue_capability_in_use():
    queues = [QueueInfo("research", capability=Resources(gpu=2, cpu=10**9, memory=10**15))]
    nodes = [node("a", gpus=8)]
    jobs = [
        job(1, gpu=2, queue="research", running_on=[("a", (0, 1))]),
        job(2, gpu=1, queue="research"),
    ]
    result = run_cycle(snapshot(nodes, jobs, queues))
    assert result.pending[2].message == 'queue "research" at capability (gpu 2/2)'


def test_it_reserves_for_the_blocked_job_and_backfills_short_ones():
    nodes = [node("a", gpus=4)]
    jobs = [
        job(1, gpu=2, running_on=[("a", (0, 1))], walltime=1000, started_at=NOW - 100),
        job(2, gpu=4, priority=10),  # waits for job 1: reservation at NOW + 900
        job(3, gpu=1, walltime=500),  # ends before the reservation: backfilled
        job(4, gpu=1, walltime=5000),  # fits now, but would delay it: waits
        job(5, gpu=1, walltime=None),  # no walltime: only spare resources, none here
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.easy())
    assert placed_jobs(result) == {3}
    assert result.pending[2].code == "Reserved"
    assert result.pending[2].estimated_start == NOW + 900
    assert result.pending[4].code == "ReservedForOther"
    assert result.pending[5].code == "ReservedForOther"


def test_it_does_not_let_later_jobs_pass_a_blocked_one_under_fcfs():
    nodes = [node("a", gpus=4)]
    jobs = [
        job(1, gpu=3, running_on=[("a", (0, 1, 2))]),
        job(2, gpu=4, priority=10),
        job(3, gpu=1, walltime=10),
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.fcfs())
    assert result.binds == []
    assert result.pending[3].code == "Priority"


def test_it_places_a_blocked_job_on_a_free_node_instead_of_reserving():
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    jobs = [
        job(1, gpu=4, running_on=[("a", (0, 1, 2, 3))], walltime=1000, started_at=NOW),
        job(2, gpu=4, priority=10),  # will take node a when job 1 ends... or b now? b is free
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.easy())
    assert placed_jobs(result) == {2}  # it simply fits on b


def test_it_preempts_the_cheapest_lower_priority_victim():
    nodes = [node("a", gpus=2)]
    jobs = [
        job(1, gpu=1, priority=1, running_on=[("a", (0,))]),
        job(2, gpu=1, priority=2, running_on=[("a", (1,))]),
        job(3, gpu=1, priority=10),
    ]
    result = run_cycle(snapshot(nodes, jobs))
    assert [(e.job_id, e.reason, e.preemptor_job_id) for e in result.evictions] == [
        (1, "Preempted", 3)
    ]
    assert result.pending[3].code == "Preempting"
    assert result.binds == []  # it binds once the victim's tasks are confirmed stopped


@pytest.mark.parametrize(
    "victim",
    [
        job(1, gpu=1, priority=50, running_on=[("a", (0,))]),  # higher priority
        job(1, gpu=1, priority=1, preemptible=False, running_on=[("a", (0,))]),
        job(1, gpu=1, priority=1, queue="other", running_on=[("a", (0,))]),  # other queue
    ],
)
def test_it_never_preempts_what_it_may_not(victim):
    nodes = [node("a", gpus=1)]
    queues = [QueueInfo("default"), QueueInfo("other", reclaimable=False)]
    result = run_cycle(snapshot(nodes, [victim, job(2, gpu=1, priority=10)], queues))
    assert result.evictions == []


def test_it_does_not_evict_again_while_victims_are_still_releasing():
    nodes = [node("a", gpus=2)]
    releasing = job(1, gpu=1, priority=1, running_on=[("a", (0,))], state="Running")
    releasing.tasks[0].state = "Releasing"
    jobs = [
        releasing,
        job(2, gpu=1, priority=1, running_on=[("a", (1,))]),
        job(3, gpu=1, priority=9),
    ]
    result = run_cycle(snapshot(nodes, jobs))
    assert result.evictions == []
    assert result.pending[3].code == "Preempting"


def test_it_reclaims_from_a_queue_above_its_share():
    nodes = [node("a", gpus=4)]
    queues = [QueueInfo("greedy", weight=1), QueueInfo("starved", weight=1)]
    jobs = [job(i, gpu=1, queue="greedy", running_on=[("a", (i - 1,))]) for i in range(1, 5)] + [
        job(9, gpu=1, queue="starved")
    ]
    result = run_cycle(snapshot(nodes, jobs, queues))
    assert [(e.reason, e.preemptor_job_id) for e in result.evictions] == [("Reclaimed", 9)]


def test_it_orders_queues_by_weighted_fair_share():
    nodes = [node("a", gpus=2)]
    queues = [QueueInfo("heavy", weight=3), QueueInfo("light", weight=1)]
    jobs = [
        job(1, gpu=1, queue="light", running_on=[("a", (0,))]),
        job(2, gpu=1, queue="light", priority=100, created_at=1),
        job(3, gpu=1, queue="heavy", created_at=2),
    ]
    result = run_cycle(snapshot(nodes, jobs, queues), SchedulingPolicy.fcfs())
    assert placed_jobs(result) == {3}


def test_it_gives_the_same_decisions_for_the_same_snapshot():
    nodes = [node(f"n{i}", gpus=4, labels={"r": str(i % 2)}) for i in range(6)]
    jobs = [job(i, gpu=1 + i % 3, replicas=1 + i % 2, priority=i % 4) for i in range(1, 40)]
    first = run_cycle(snapshot(nodes, jobs))
    second = run_cycle(snapshot(nodes, jobs))
    assert first.binds == second.binds
    assert first.pending == second.pending


def test_it_backfills_every_fitting_job_after_one_whose_plugin_raises():
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    jobs = [
        job(1, gpu=2, running_on=[("a", (0, 1))], walltime=1000),
        job(2, gpu=2, replicas=2, priority=5),  # blocked: takes the reservation
        job(3, gpu=1, walltime=10),  # its plugin raises, in backfill
        job(4, gpu=1, walltime=10),
        job(5, gpu=1, walltime=10),
    ]
    config = SchedulingPolicy(
        actions=SchedulingPolicy.easy().actions, extra_plugins=(RaisesFor(3),)
    )
    result = run_cycle(snapshot(nodes, jobs), config)
    assert placed_jobs(result) == {4, 5}
    assert {b.action for b in result.binds} == {"backfill"}
    assert result.pending[3].code == "SchedulerError"
    assert result.pending[2].code == "Reserved"


def test_it_never_gives_the_reservation_to_a_job_no_node_can_take():
    nodes = [node("a", gpus=4)]
    jobs = [
        job(1, gpu=2, running_on=[("a", (0, 1))], walltime=1000),
        job(2, gpu=1, selector={"zone": "mars"}, priority=9),
        job(3, gpu=4, priority=5),  # blocked by resources: this one is reserved
        job(4, gpu=1, walltime=5000),
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.easy())
    assert result.pending[2].code == "NeverFits"
    assert result.pending[3].code == "Reserved"
    assert result.pending[3].estimated_start == NOW + 900
    assert result.pending[4].message == (
        "waiting for job 3 (reservation): starting now would delay it"
    )


def test_it_keeps_the_reserved_nodes_when_the_start_is_unknown():
    """Resources held by a job without walltime: no start time, yet a job without walltime
    may only use what the reserved job will not need."""
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    jobs = [
        job(1, gpu=2, running_on=[("a", (0, 1))], walltime=None),
        job(2, gpu=2, running_on=[("b", (0, 1))], walltime=None),
        job(3, gpu=4, priority=9),  # reserved on node a, start unknown
        job(4, gpu=2, walltime=None),  # node a's free GPUs are reserved; b's are spare
        job(5, gpu=2, walltime=None),  # nothing left that the reservation does not need
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy.easy())
    assert [(b.job_id, b.node) for b in result.binds] == [(4, "b")]
    assert result.pending[3].code == "Reserved"
    assert result.pending[3].estimated_start is None
    assert result.pending[5].code == "ReservedForOther"


def test_it_places_the_remaining_tasks_of_a_running_gang():
    nodes = [node("a", gpus=4)]
    running = job(1, gpu=1, replicas=4, min_available=2, running_on=[("a", (0,)), ("a", (1,))])
    result = run_cycle(snapshot(nodes, [running]))
    assert [(b.job_id, b.devices) for b in result.binds] == [(1, (2,)), (1, (3,))]


def test_it_keeps_extra_tasks_within_the_queue_capability():
    queues = [QueueInfo("research", capability=Resources(gpu=3, cpu=10**9, memory=10**15))]
    nodes = [node("a", gpus=8)]
    result = run_cycle(
        snapshot(nodes, [job(1, gpu=1, replicas=6, min_available=2, queue="research")], queues)
    )
    assert len(result.binds) == 3


@pytest.mark.parametrize(
    ("min_available", "message"),
    [(3, "gang: 2/3 tasks placeable"), (4, "gang: 2/4 tasks placeable")],
)
def test_it_explains_each_gang_with_its_own_size(min_available, message):
    """The second job has the first's shape: it is refused from the memo, with its own size."""
    nodes = [node("a", gpus=1), node("b", gpus=1)]
    jobs = [
        job(1, gpu=1, replicas=5, min_available=5, priority=9),
        job(2, gpu=1, replicas=5, min_available=min_available),
    ]
    result = run_cycle(snapshot(nodes, jobs), SchedulingPolicy(strict_order=False))
    assert result.pending[1].message.startswith("gang: 2/5 tasks placeable")
    assert result.pending[2].message.startswith(message)


def test_it_binds_nothing_on_nodes_held_for_a_preempting_job():
    nodes = [node("a", gpus=1), node("b", gpus=1, cpu=1)]
    jobs = [
        job(1, gpu=1, cpu=1, priority=1, running_on=[("a", (0,))]),
        job(2, gpu=1, cpu=4, priority=10),  # only node a has the cpu: preempts job 1
        job(3, gpu=0, cpu=1, walltime=10),
    ]
    result = run_cycle(snapshot(nodes, jobs))
    assert [e.job_id for e in result.evictions] == [1]
    assert all(b.node != "a" for b in result.binds)
    assert result.pending[2].message == "waiting for preempted jobs to release resources (jobs 1)"


def test_it_runs_without_a_disabled_plugin():
    nodes = [node("a", gpus=2), node("b", gpus=1)]
    gang = job(1, gpu=2, replicas=2)
    assert run_cycle(snapshot(nodes, [gang])).binds == []
    relaxed = run_cycle(snapshot(nodes, [gang]), SchedulingPolicy(disabled_plugins=("gang",)))
    assert [b.node for b in relaxed.binds] == ["a"]
