"""The standing session decides as `run_cycle` on full snapshots did: the same job starts at
the same time on the same nodes and devices.

The fixtures were recorded with the core as it was before the standing session existed
(commit e780225: `run_cycle` on a fresh snapshot at every arrival and completion), on the
first 2,000 jobs of the KTH SP2 log and on a generated GPU trace (several queues with
fair share and a capability, priorities, gangs, node selectors, a cordoned node, jobs
without a walltime, jobs that never fit)."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest

from scheduler.core.model import DeviceInfo, NodeInfo, QueueInfo, SchedulingPolicy
from scheduler.core.replay import ReplayResult, TraceJob, replay
from scheduler.core.resources import Resources
from tests.core.builders import GI, POLICIES

FIXTURES = Path(__file__).parent / "fixtures"


def generated_trace(seed: int, count: int) -> list[TraceJob]:
    """The generated trace the fixture was recorded on (do not change: it is the input)."""
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(count):
        t += rng.expovariate(1 / 90)
        tasks = rng.choice([1, 1, 1, 2, 2, 3, 4])
        gpu = rng.choice([0, 1, 1, 2, 4, 8])
        if rng.random() < 0.01:
            gpu = 9  # never fits
        cpu = rng.choice([1, 2, 4, 8, 16]) * 1000
        memory = rng.choice([2, 8, 32, 64]) * GI
        selector = {}
        if gpu and rng.random() < 0.3:
            selector = {"gpu": rng.choice(["a100", "h100"])}
        walltime: float | None = rng.choice([600.0, 1800.0, 3600.0, 7200.0, 14400.0])
        assert walltime is not None
        runtime = round(walltime * rng.uniform(0.05, 1.0))
        if rng.random() < 0.05:
            walltime = None
        queue = rng.choice(["research", "research", "prod", "batch"])
        priority = rng.choice([0, 0, 0, 1, 2])
        jobs.append(
            TraceJob(
                i + 1,
                round(t),
                tasks,
                Resources(cpu, memory, gpu),
                runtime,
                walltime,
                queue,
                priority,
                selector,
            )  # fmt: skip
        )
    return jobs


def generated_cluster() -> tuple[list[NodeInfo], list[QueueInfo]]:
    def gpus(n: int) -> list[DeviceInfo]:
        return [DeviceInfo(d) for d in range(n)]

    big = Resources(64000, 512 * GI, 8)
    nodes = [
        NodeInfo(f"g{i:02d}", big, {"gpu": "a100" if i < 8 else "h100"}, "Ready", gpus(8))
        for i in range(12)
    ]
    nodes.append(NodeInfo("g12", big, {"gpu": "a100"}, "Cordoned", gpus(8)))
    nodes += [
        NodeInfo(f"c{i}", Resources(32000, 128 * GI, 0), {"kind": "cpu"}, "Ready", [])
        for i in range(2)
    ]
    queues = [
        QueueInfo("research", weight=2),
        QueueInfo("prod", weight=1),
        QueueInfo("batch", weight=1, capability=Resources(10**9, 10**15, 16)),
    ]
    return nodes, queues


def kth_trace() -> tuple[list[TraceJob], dict[str, list[list[object] | None]]]:
    data = json.loads((FIXTURES / "kth_2000_schedule.json").read_text())
    jobs = [
        TraceJob(id, submit, procs, Resources(1000, GI), runtime, walltime)
        for id, submit, procs, walltime, runtime in data["jobs"]
    ]
    return jobs, data["schedules"]


def kth_cluster() -> tuple[list[NodeInfo], list[QueueInfo]]:
    return [NodeInfo(f"n{i:03d}", Resources(1000, GI)) for i in range(100)], [QueueInfo("default")]


def schedule(jobs: list[TraceJob], result: ReplayResult) -> list[list[object] | None]:
    """Per job: [start, crc32 of its placements in task order], or None if it never ran."""
    rows: list[list[object] | None] = []
    for job in jobs:
        if job.id not in result.starts:
            rows.append(None)
            continue
        where = [[node, list(devices)] for node, devices in result.placements[job.id]]
        crc = zlib.crc32(json.dumps(where).encode())
        start = result.starts[job.id]
        rows.append([int(start) if float(start).is_integer() else start, f"{crc:08x}"])
    return rows


@pytest.fixture(scope="module")
def kth_replays() -> dict[str, ReplayResult]:
    jobs, _ = kth_trace()
    nodes, queues = kth_cluster()
    return {p: replay(jobs, nodes, queues, POLICIES[p]) for p in ("easy", "fcfs")}


@pytest.mark.parametrize("policy", ["easy", "fcfs"])
def test_the_standing_session_schedules_the_kth_log_as_full_cycles_did(policy, kth_replays):
    jobs, recorded = kth_trace()
    assert schedule(jobs, kth_replays[policy]) == recorded[policy]


@pytest.mark.parametrize("policy", ["easy", "fcfs", "default", "spread", "loose"])
def test_the_standing_session_schedules_a_gpu_trace_as_full_cycles_did(policy):
    recorded = json.loads((FIXTURES / "generated_800_schedule.json").read_text())
    jobs = generated_trace(14, 800)
    nodes, queues = generated_cluster()
    result = replay(jobs, nodes, queues, POLICIES[policy])
    assert schedule(jobs, result) == recorded["schedules"][policy]


@pytest.mark.parametrize("policy", ["easy", "default"])
def test_full_cycles_and_the_standing_session_decide_the_same(policy):
    """Today's reference path, run_cycle on a full snapshot at every event, beside the
    standing session on a shorter trace: same schedule, same promised reservations."""
    jobs = generated_trace(3, 150)
    nodes, queues = generated_cluster()
    full = replay(jobs, nodes, queues, POLICIES[policy], incremental=False)
    standing = replay(jobs, nodes, queues, POLICIES[policy], incremental=True)
    assert schedule(jobs, standing) == schedule(jobs, full)
    assert standing.first_reservation == full.first_reservation
    assert full.starts  # the trace does start jobs


def test_no_reserved_job_starts_later_than_its_first_reservation(kth_replays):
    result = kth_replays["easy"]
    assert result.first_reservation  # the log does make jobs wait for a reservation
    late = {i: t for i, t in result.first_reservation.items() if result.starts[i] > t}
    assert late == {}


def test_with_predictions_off_the_kth_log_is_scheduled_as_recorded():
    """Issue #21: runtime predictions are off unless asked for, and then change nothing,
    start estimates at submission included (they only read the replay's state)."""
    jobs, recorded = kth_trace()
    nodes, queues = kth_cluster()
    result = replay(jobs, nodes, queues, POLICIES["easy"], predictions=False, estimates=True)
    assert schedule(jobs, result) == recorded["easy"]
    assert result.predicted == {}
    assert len(result.estimates) == len(jobs)  # every job fits once the cluster drains


@pytest.mark.parametrize("correction", ["walltime", "stepwise"])
def test_full_cycles_and_the_standing_session_decide_the_same_with_predictions(correction):
    """Predictions raised as running jobs outlive them: the standing session's kept ends
    and plans give what a fresh snapshot at every event gives."""
    jobs = generated_trace(3, 150)
    for i, job in enumerate(jobs):
        job.owner = f"u{i % 4}"
    nodes, queues = generated_cluster()
    config = SchedulingPolicy(actions=POLICIES["easy"].actions, prediction_correction=correction)
    full = replay(jobs, nodes, queues, config, incremental=False, predictions=True)
    standing = replay(jobs, nodes, queues, config, incremental=True, predictions=True)
    assert schedule(jobs, standing) == schedule(jobs, full)
    assert standing.first_reservation == full.first_reservation
    off = replay(jobs, nodes, queues, config)
    assert schedule(jobs, standing) != schedule(jobs, off)  # predictions do change decisions
