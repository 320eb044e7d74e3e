"""Cluster metrics for /metrics, computed at scrape time from a few aggregate queries.

Nothing here is kept in process memory, so every web worker answers the same numbers: gauges
come from the live tables, `berth_jobs_finished_total` from the accounting counter table, and
the scheduler's cycle histogram from the heartbeat row its leader writes after each cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Min, Sum
from django.utils import timezone
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from scheduler.cycle.liveness import HEARTBEAT_PK, PHASE_BUCKETS
from scheduler.models import (
    Device,
    FinishedJobCount,
    Job,
    Node,
    Queue,
    SchedulerHeartbeat,
    Task,
    UsageRecord,
)
from scheduler.states.names import JOB_FINAL, TASK_ON_NODE, JobState, NodeState

# The limits an agent may enforce (scheduler/agent/cgroups.py), one gauge each per node.
ENFORCED_LIMITS = ("memory", "swap", "cpu", "pids", "devices", "tracking")


def _jobs(queues: list[str]) -> Iterator[Metric]:
    counts = {
        (row["queue__name"], row["state"]): row["n"]
        for row in Job.objects.values("queue__name", "state").annotate(n=Count("id")).order_by()
    }
    jobs = GaugeMetricFamily("berth_jobs", "Jobs by queue and state.", labels=["queue", "state"])
    for queue in queues:
        for state in JobState.values:
            jobs.add_metric([queue, state], counts.get((queue, state), 0))
    yield jobs

    oldest = dict(
        Job.objects.filter(state=JobState.PENDING)
        .values("queue__name")
        .annotate(first=Min("created_at"))
        .order_by()
        .values_list("queue__name", "first")
    )
    now = timezone.now()
    pending = GaugeMetricFamily(
        "berth_queue_pending_seconds", "Age of the oldest pending job per queue (0: none).",
        labels=["queue"],
    )  # fmt: skip
    for queue in queues:
        first = oldest.get(queue)
        pending.add_metric([queue], max(0.0, (now - first).total_seconds()) if first else 0.0)
    yield pending

    finished = CounterMetricFamily(
        "berth_jobs_finished", "Jobs that reached a final state, by queue and state.",
        labels=["queue", "state"],
    )  # fmt: skip
    done = {(r.queue, r.state): r.count for r in FinishedJobCount.objects.all()}
    for queue in sorted(set(queues) | {q for q, _ in done}):
        for state in JOB_FINAL:
            finished.add_metric([queue, state], done.get((queue, state), 0))
    yield finished


def _gpu_idle(queues: list[str]) -> Metric:
    """Running jobs flagged for holding GPUs idle (scheduler/ops/gpu_idle.py), per queue."""
    counts = dict(
        Job.objects.filter(state=JobState.RUNNING, gpu_idle_since__isnull=False)
        .values("queue__name")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("queue__name", "n")
    )
    gauge = GaugeMetricFamily(
        "berth_jobs_gpu_idle", "Running jobs flagged for holding GPUs idle (below 1 % for "
        "BERTH_GPU_IDLE_MINUTES), by queue.", labels=["queue"],
    )  # fmt: skip
    for queue in queues:
        gauge.add_metric([queue], counts.get(queue, 0))
    return gauge


def _split(capacity: dict[bool, int], held: dict[bool, int]) -> dict[str, int]:
    """allocated / free / unavailable from capacity and use on ready (True) and other nodes."""
    return {
        "allocated": held[True] + held[False],
        "free": max(0, capacity[True] - held[True]),
        "unavailable": max(0, capacity[False] - held[False]),
    }


def _capacity() -> Iterator[Metric]:
    nodes = dict(Node.objects.values("state").annotate(n=Count("id")).order_by()
                 .values_list("state", "n"))  # fmt: skip
    gauge = GaugeMetricFamily("berth_nodes", "Nodes by state.", labels=["state"])
    for state in NodeState.values:
        gauge.add_metric([state], nodes.get(state, 0))
    yield gauge

    yield _enforced()

    gpus_total: dict[bool, int] = defaultdict(int)
    gpus_held: dict[bool, int] = defaultdict(int)
    for row in (
        Device.objects.values("node__state", "healthy")
        .annotate(n=Count("id", distinct=True), held=Count("allocations__device", distinct=True))
        .order_by()
    ):
        usable = row["node__state"] == NodeState.READY and row["healthy"]
        gpus_total[usable] += row["n"]
        gpus_held[usable] += row["held"]
    gpus = GaugeMetricFamily("berth_gpus", "GPU devices: allocated, free (on ready nodes, "
                             "healthy) or unavailable.", labels=["state"])  # fmt: skip
    for state, value in _split(gpus_total, gpus_held).items():
        gpus.add_metric([state], value)
    yield gpus

    cap: dict[str, dict[bool, int]] = {"cpu": defaultdict(int), "memory": defaultdict(int)}
    held: dict[str, dict[bool, int]] = {"cpu": defaultdict(int), "memory": defaultdict(int)}
    for row in Node.objects.values("state").annotate(c=Sum("cpu"), m=Sum("memory")).order_by():
        ready = row["state"] == NodeState.READY
        cap["cpu"][ready] += row["c"] or 0
        cap["memory"][ready] += row["m"] or 0
    for row in (
        Task.objects.filter(state__in=TASK_ON_NODE, node__isnull=False)
        .values("node__state").annotate(c=Sum("cpu"), m=Sum("memory")).order_by()
    ):  # fmt: skip
        ready = row["node__state"] == NodeState.READY
        held["cpu"][ready] += row["c"] or 0
        held["memory"][ready] += row["m"] or 0
    for name, unit, key in (("berth_cpu_millicores", "CPU millicores", "cpu"),
                            ("berth_memory_bytes", "Memory bytes", "memory")):  # fmt: skip
        help_text = f"{unit}: allocated to tasks, free on ready nodes, or unavailable."
        family = GaugeMetricFamily(name, help_text, labels=["state"])
        for state, value in _split(cap[key], held[key]).items():
            family.add_metric([state], value)
        yield family


def _enforced() -> Metric:
    """Per node and limit, whether its agent enforces it (1) or not (0)."""
    gauge = GaugeMetricFamily("berth_node_enforced", "Whether a node's agent enforces a limit "
                              "on its tasks (scheduler/agent/fence.py).",
                              labels=["node", "limit"])  # fmt: skip
    for name, info in Node.objects.order_by("name").values_list("name", "enforcement"):
        enforced = set((info or {}).get("enforced") or [])
        for limit in ENFORCED_LIMITS:
            gauge.add_metric([name, limit], 1 if limit in enforced else 0)
    return gauge


def _scheduler() -> Iterator[Metric]:
    row = SchedulerHeartbeat.objects.filter(pk=HEARTBEAT_PK).first()
    if row is None:
        return
    yield GaugeMetricFamily(
        "berth_scheduler_last_cycle_timestamp_seconds",
        "Unix time the last scheduler cycle ended.", value=row.last_cycle_at.timestamp(),
    )  # fmt: skip
    histogram = HistogramMetricFamily(
        "berth_scheduler_cycle_seconds", "Scheduler cycle time per phase ('total': whole cycle).",
        labels=["phase"],
    )  # fmt: skip
    for phase, entry in sorted((row.phase_histograms or {}).items()):
        counts: list[Any] = entry.get("buckets", [])
        if len(counts) != len(PHASE_BUCKETS):
            continue
        cumulative, buckets = 0, []
        for bound, n in zip(PHASE_BUCKETS, counts, strict=True):
            cumulative += int(n)
            buckets.append((floatToGoString(bound), float(cumulative)))
        buckets.append(("+Inf", float(entry.get("count", cumulative))))
        histogram.add_metric([phase], buckets, float(entry.get("sum", 0.0)))
    yield histogram


def _usage() -> Iterator[Metric]:
    """What each user used per queue, from the accounting records (kept when tasks end and
    through TTL deletion of their jobs): counters, so `increase(...[30d])` is a month's use."""
    rows = (
        UsageRecord.objects.values("username", "queue")
        .annotate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"), n=Count("id"))
        .order_by("username", "queue")
    )
    gpu = CounterMetricFamily("berth_usage_gpu_seconds", "GPU-seconds used by ended task "
                              "attempts, by user and queue.", labels=["user", "queue"])  # fmt: skip
    cpu = CounterMetricFamily("berth_usage_cpu_seconds", "CPU core-seconds used by ended task "
                              "attempts, by user and queue.", labels=["user", "queue"])  # fmt: skip
    for row in rows:
        gpu.add_metric([row["username"], row["queue"]], float(row["gpu"] or 0.0))
        cpu.add_metric([row["username"], row["queue"]], float(row["cpu"] or 0.0))
    yield gpu
    yield cpu


class ClusterCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        queues = list(Queue.objects.order_by("name").values_list("name", flat=True))
        yield from _jobs(queues)
        yield _gpu_idle(queues)
        yield from _capacity()
        yield from _scheduler()
        yield from _usage()
