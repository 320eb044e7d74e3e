"""What the pages show, read once and shared by the first render and the pushes."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from django.db.models import Prefetch, QuerySet

from dashboard.dag import layout
from scheduler.core.quantity import format_cpu
from scheduler.models import Allocation, Device, Event, Flow, Job, Node, Queue, Task
from scheduler.states import TASK_ON_NODE


def readable_memory(size: int) -> str:
    """Bytes rounded for people: 23.5Gi, 512Mi."""
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size >= factor:
            value = size / factor
            return (
                f"{value:.0f}{unit}"
                if value >= 100 or value == int(value)
                else f"{value:.1f}{unit}"
            )
    return f"{size}B" if size else "0"


def node_cards(ids: list[int] | None = None) -> list[dict[str, Any]]:
    nodes: QuerySet[Node] = Node.objects.order_by("name").prefetch_related(
        Prefetch(
            "devices",
            queryset=Device.objects.order_by("index").select_related(
                "allocation__task__job__owner", "allocation__task__job__queue"
            ),
        ),
        Prefetch("tasks", queryset=Task.objects.filter(state__in=TASK_ON_NODE)),
    )
    if ids is not None:
        nodes = nodes.filter(pk__in=ids)
    cards = []
    for node in nodes:
        used_cpu = sum(t.cpu for t in node.tasks.all())
        used_memory = sum(t.memory for t in node.tasks.all())
        devices = []
        for d in node.devices.all():
            allocation = getattr(d, "allocation", None)
            job = allocation.task.job if allocation else None
            devices.append({"index": d.index, "model": d.model, "healthy": d.healthy, "job": job,
                            "colour": (job.pk * 47) % 360 if job else None})  # fmt: skip
        cards.append({
            "node": node, "devices": devices,
            "cpu": f"{format_cpu(used_cpu)}/{format_cpu(node.cpu)}",
            "memory": f"{readable_memory(used_memory)}/{readable_memory(node.memory)}",
            "cpu_pct": round(100 * used_cpu / node.cpu) if node.cpu else 0,
            "memory_pct": round(100 * used_memory / node.memory) if node.memory else 0,
        })  # fmt: skip
    return cards


def cluster_summary() -> dict[str, Any]:
    nodes = list(Node.objects.all())
    gpus = Device.objects.filter(healthy=True).count()
    used_gpus = Allocation.objects.count()
    states = Counter(n.state for n in nodes)
    jobs = Counter(Job.objects.filter(state__in=("Pending", "Running", "Suspended"))
                   .values_list("state", flat=True))  # fmt: skip
    queues = []
    held: dict[str, Counter[str]] = defaultdict(Counter)
    for queue, cpu, memory, gpu in Task.objects.filter(state__in=TASK_ON_NODE).values_list(
        "job__queue__name", "cpu", "memory", "gpu"
    ):
        held[queue].update({"cpu": cpu, "memory": memory, "gpu": gpu})
    total_cpu = sum(n.cpu for n in nodes) or 1
    total_memory = sum(n.memory for n in nodes) or 1
    all_queues = list(Queue.objects.order_by("name"))
    weights = sum(q.weight for q in all_queues) or 1
    for q in all_queues:
        h = held[q.name]
        share = max(h["cpu"] / total_cpu, h["memory"] / total_memory,
                    h["gpu"] / gpus if gpus else 0)  # fmt: skip
        queues.append({"queue": q, "gpu": h["gpu"], "cpu": format_cpu(h["cpu"]),
                       "share": round(100 * share),
                       "fair": round(100 * q.weight / weights)})  # fmt: skip
    return {"nodes": len(nodes), "ready": states.get("Ready", 0), "states": dict(states),
            "gpus": gpus, "used_gpus": used_gpus, "pending": jobs.get("Pending", 0),
            "running": jobs.get("Running", 0), "suspended": jobs.get("Suspended", 0),
            "queues": queues}  # fmt: skip


def job_detail(job: Job, with_logs: bool = True) -> dict[str, Any]:
    tasks = list(job.tasks.select_related("node").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("device"))
    ).order_by("group", "index"))  # fmt: skip
    for task in tasks:
        task.device_list = ",".join(str(a.device.index) for a in task.allocations.all())  # type: ignore[attr-defined]
        if with_logs:  # the output pane is rendered once; pushes append to it
            task.log_text = "".join(  # type: ignore[attr-defined]
                task.logs.filter(attempt=task.attempt)
                .order_by("offset")
                .values_list("data", flat=True)
            )[-20000:]
    reasons = list(job.pending_reasons or [])
    if job.hold_reason:
        reasons.insert(0, job.hold_reason)
    return {"job": job, "tasks": tasks, "reasons": reasons,
            "events": list(Event.objects.filter(job=job).order_by("-id")[:50])}  # fmt: skip


def flow_detail(flow: Flow) -> dict[str, Any]:
    steps = list(flow.steps.select_related("template").order_by("position"))
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    jobs_by_step: dict[int, list[Job]] = defaultdict(list)
    for job in flow.jobs.only("id", "name", "state", "step_id", "item_index").order_by("id"):
        counts[job.step_id or 0][job.state] = counts[job.step_id or 0].get(job.state, 0) + 1
        jobs_by_step[job.step_id or 0].append(job)
    rows = [{"step": s, "jobs": jobs_by_step[s.pk], "total": len(s.items) if s.items else 1}
            for s in steps]  # fmt: skip
    return {"flow": flow, "rows": rows, "dag": layout(steps, counts),
            "events": list(Event.objects.filter(flow=flow).order_by("-id")[:30])}  # fmt: skip
