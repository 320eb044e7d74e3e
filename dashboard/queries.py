"""What the pages show, read once and shared by the first render and the pushes."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import yaml
from django.conf import settings
from django.db.models import Count, Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from dashboard.dag import layout
from scheduler.core.plugins import fair_share
from scheduler.core.quantity import format_cpu
from scheduler.core.resources import Resources
from scheduler.flows.explain import step_wait_reasons
from scheduler.jobs import logs
from scheduler.lifecycle import PREEMPTED
from scheduler.models import Allocation, Device, Event, Flow, Job, Node, Queue, Task
from scheduler.ops.accounting import usage_by_attempt, usage_view
from scheduler.states.names import TASK_ON_NODE, JobRequest, JobState, NodeState, StepState

LOG_TAIL_CHARS = logs.TAIL_CHARS
LEGEND = [s.value for s in StepState]


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


JOB_COLOURS = 16  # .jc-0 ... .jc-15 in berth.css: distinct, all readable with white text


def node_cards(ids: list[int] | None = None) -> list[dict[str, Any]]:
    """One card per node (only `ids` if given): use, labels and each GPU with its holder."""
    nodes: QuerySet[Node] = Node.objects.order_by("name").prefetch_related(
        Prefetch(
            "devices",
            queryset=Device.objects.order_by("index").prefetch_related(
                Prefetch(
                    "allocations",
                    queryset=Allocation.objects.select_related(
                        "task__job__owner", "task__job__queue"
                    ),
                )
            ),
        ),
        Prefetch("tasks", queryset=Task.objects.filter(state__in=TASK_ON_NODE)),
    )
    if ids is not None:
        nodes = nodes.filter(pk__in=ids)
    cards = []
    for node in nodes:
        tasks = node.tasks.all()
        used_cpu = sum(t.cpu for t in tasks)
        used_memory = sum(t.memory for t in tasks)
        devices = []
        for d in node.devices.all():
            devices.append(_device_card(d))
        cards.append({
            "node": node, "devices": devices, "tasks": len(tasks),
            "labels": [f"{k}={v}" for k, v in sorted((node.labels or {}).items())][:6],
            "cpu": f"{format_cpu(used_cpu)}/{format_cpu(node.cpu)}",
            "memory": f"{readable_memory(used_memory)}/{readable_memory(node.memory)}",
            "cpu_pct": round(100 * used_cpu / node.cpu) if node.cpu else 0,
            "memory_pct": round(100 * used_memory / node.memory) if node.memory else 0,
        })  # fmt: skip
    return cards


def _device_card(device: Device) -> dict[str, Any]:
    """A GPU as the grid shows it: its holder when held whole; a shared GPU's occupants,
    each job with its share."""
    held = list(device.allocations.all())
    whole = held[0].task.job if len(held) == 1 and held[0].share == 1000 else None
    occupants = [
        {"job": a.task.job, "share": f"{a.share / 1000:g}", "colour": a.task.job_id % JOB_COLOURS}
        for a in held
        if whole is None
    ]
    return {
        "index": device.index, "model": device.model, "healthy": device.healthy, "job": whole,
        "colour": whole.pk % JOB_COLOURS if whole else None, "occupants": occupants,
        "free": f"{1 - sum(a.share for a in held) / 1000:g}",
    }  # fmt: skip


def _pct(part: float, whole: float) -> int:
    return round(100 * part / whole) if whole else 0


def cluster_summary() -> dict[str, Any]:
    """Totals and, per queue, its dominant share (DRF over cpu/memory/gpu) against its
    weighted fair share. Aggregates only: no query grows with the number of finished jobs."""
    nodes = list(Node.objects.only("id", "cpu", "memory", "state"))
    gpus = Device.objects.filter(healthy=True).count()
    # Shared GPUs count what their fractions hold: 4 tasks of 0.25 are 1 GPU in use.
    shares = Allocation.objects.aggregate(s=Sum("share"))["s"] or 0
    used_gpus: float = shares // 1000 if shares % 1000 == 0 else round(shares / 1000, 2)
    states = Counter(n.state for n in nodes)
    jobs: Counter[str] = Counter()
    by_queue: dict[str, Counter[str]] = defaultdict(Counter)
    for name, state, n in (
        Job.objects.filter(state__in=(JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED))
        .filter(array_size__isnull=True)  # an array's parent only summarises its elements
        .values_list("queue__name", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        jobs[state] += n
        by_queue[name][state] += n
    held: dict[str, Counter[str]] = defaultdict(Counter)
    # GPUs in thousandths: a fraction of one counts as what it is, as the scheduler's DRF does.
    for queue, cpu, memory, gpu, share in Task.objects.filter(state__in=TASK_ON_NODE).values_list(
        "job__queue__name", "cpu", "memory", "gpu", "gpu_share"
    ):
        held[queue].update({"cpu": cpu, "memory": memory, "gpu": share or gpu * 1000})
    total_cpu = sum(n.cpu for n in nodes)
    total_memory = sum(n.memory for n in nodes)
    used_cpu = sum(h["cpu"] for h in held.values())
    totals = {"cpu": total_cpu, "memory": total_memory, "gpu": gpus * 1000}
    queues = _queue_rows(held, by_queue, totals)
    return {"nodes": len(nodes), "ready": states.get(NodeState.READY, 0), "states": dict(states),
            "not_ready": states.get(NodeState.NOT_READY, 0),
            "cordoned": states.get(NodeState.CORDONED, 0),
            "draining": states.get(NodeState.DRAINING, 0) + states.get(NodeState.DRAINED, 0),
            "gpus": gpus, "used_gpus": used_gpus, "gpu_pct": _pct(used_gpus, gpus),
            "used_cpu": format_cpu(used_cpu), "total_cpu": format_cpu(total_cpu),
            "cpu_pct": _pct(used_cpu, total_cpu), "pending": jobs["Pending"],
            "running": jobs["Running"], "suspended": jobs["Suspended"],
            "queues": queues, "gpu_idle": gpu_idle_jobs(),
            "gpu_idle_minutes": f"{settings.BERTH_GPU_IDLE_MINUTES:g}"}  # fmt: skip


def queue_rules() -> list[dict[str, Any]]:
    """What each queue holds its users to, as the queues page lists it under the shares:
    the longest walltime, the per-user limits, when idle interactive sessions end and which
    GPU sharing modes fractions may use."""

    def limit(value: int | None, shown: Any = str) -> str:
        return "-" if value is None else shown(value)

    def minutes(value: float) -> str:
        return "never" if not value else f"{value:g} min"

    rules = []
    for queue in Queue.objects.order_by("name"):
        walltime = queue.max_walltime
        rules.append({
            "name": queue.name,
            "max_walltime": "-" if walltime is None else _hours(walltime),
            "gpus": limit(queue.max_user_running_gpus),
            "cpus": limit(queue.max_user_running_cpus, format_cpu),
            "running": limit(queue.max_user_running_jobs),
            "pending": limit(queue.max_user_pending_jobs),
            "staff_exempt": queue.user_limits_exempt_staff,
            "terminal_idle": minutes(queue.interactive_idle_minutes),
            "gpu_session_idle": minutes(queue.interactive_gpu_idle_minutes),
            "sharing": ", ".join(queue.gpu_sharing) if queue.gpu_sharing else "any",
        })  # fmt: skip
    return rules


def _hours(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def gpu_idle_jobs(limit: int = 50) -> list[Job]:
    """Running jobs flagged for holding GPUs idle (scheduler/ops/gpu_idle.py), longest first."""
    return list(
        Job.objects.filter(state=JobState.RUNNING, gpu_idle_since__isnull=False)
        .select_related("owner", "queue")
        .only("pk", "name", "gpu_idle_since", "owner__username", "queue__name")
        .order_by("gpu_idle_since", "pk")[:limit]
    )


def _scheduled_queues(held: dict[str, Counter[str]]) -> set[str]:
    """The queues the scheduler counts when it shares the cluster out (DRFPlugin.deserved):
    those with a job it may place (pending and not held, or preempted; a closed queue's too)
    or a task on a node."""
    waiting = (
        Job.objects.filter(
            Q(state=JobState.PENDING, hold_reason="")
            | Q(state=JobState.SUSPENDED, reason=PREEMPTED)
        )
        .exclude(requested_action=JobRequest.CANCEL)
        .values_list("queue__name", flat=True)
        .distinct()
        .order_by()
    )
    return set(waiting) | set(held)


def _queue_rows(
    held: dict[str, Counter[str]], by_queue: dict[str, Counter[str]], totals: dict[str, int]
) -> list[dict[str, Any]]:
    """Each queue's dominant share against its fair share, the weight it has among the
    queues the scheduler counts (itself included) as the scheduler reckons it."""
    all_queues = list(Queue.objects.order_by("name"))
    counted = _scheduled_queues(held)
    weights = {q.name: q.weight for q in all_queues}
    cluster = Resources(**totals)
    rows = []
    for q in all_queues:
        h = held[q.name]
        holds = Resources(cpu=h["cpu"], memory=h["memory"], gpu=h["gpu"])
        share = round(100 * holds.dominant_share(cluster))
        fair = round(100 * fair_share(weights, counted, q.name))
        rows.append({"queue": q, "gpu": f"{h['gpu'] / 1000:g}", "cpu": format_cpu(h["cpu"]),
                     "share": share, "fair": fair, "share_bar": min(share, 100),
                     "fair_bar": min(fair, 100), "running": by_queue[q.name]["Running"],
                     "pending": by_queue[q.name]["Pending"]})  # fmt: skip
    return rows


def job_detail(job: Job, with_logs: bool = True) -> dict[str, Any]:
    tasks = list(job.tasks.select_related("node").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("device"))
    ).order_by("group", "index"))  # fmt: skip
    # A record is written when an attempt ends: none to read while no task has ended.
    used = usage_by_attempt([job.pk]) if any(t.finished_at for t in tasks) else {}
    for task in tasks:
        task.device_list = ",".join(str(i) for i in task.gpu_indices())  # type: ignore[attr-defined]
        task.gpu_holding_label = (task.gpu_holding() or {}).get("isolation", "")  # type: ignore[attr-defined]
        record = used.get((task.pk, task.attempt))
        task.usage = usage_view(record) if record else None  # type: ignore[attr-defined]
        if with_logs:  # the output pane is rendered once; pushes append to it
            show_log(task, task.attempt)
    context = {"job": job, "tasks": tasks, "status": job.status, "remaining": remaining(job),
               "events": list(Event.objects.filter(job=job).order_by("-id")[:50])}  # fmt: skip
    if with_logs:  # the first render only: pushes never carry the spec
        context["tail_chars"] = LOG_TAIL_CHARS
        context["spec_yaml"] = yaml.safe_dump(job.spec, sort_keys=False, allow_unicode=True)
    return context


def remaining(job: Job) -> str:
    """A running job's walltime left as the page shows it (static/berth/remaining.js then
    ticks it in the same form: `1h 02m 05s`); "" when it has no end."""
    ends = job.walltime_ends_at
    if ends is None:
        return ""
    seconds = int((ends - timezone.now()).total_seconds())
    if seconds <= 0:
        return "none: it is being stopped"
    hours, rest = divmod(seconds, 3600)
    return f"{f'{hours}h ' if hours else ''}{rest // 60:02d}m {rest % 60:02d}s"


def show_log(task: Task, attempt: int) -> Task:
    """Set what the job page's output pane of `task` shows: `attempt`'s tail; the latest
    attempt's pane follows live (pushes append to it)."""
    task.shown_attempt = attempt  # type: ignore[attr-defined]
    task.log_live = attempt == task.attempt  # type: ignore[attr-defined]
    task.log_text, task.log_cut = logs.tail(task.pk, attempt)  # type: ignore[attr-defined]
    task.attempts = range(task.attempt, -1, -1)  # type: ignore[attr-defined]
    return task


def count_flow_jobs(flows: list[Flow]) -> None:
    """Set each flow's job counts (jobs_total, _done, _running, _failed) for the flows list
    and its pushed rows, in one grouped query over their jobs."""
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    for flow_id, state, n in (
        Job.objects.filter(flow_id__in=[f.pk for f in flows])
        .values_list("flow_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts[flow_id][state] = n
    for f in flows:
        c = counts[f.pk]
        f.jobs_total, f.jobs_done = sum(c.values()), c["Succeeded"]  # type: ignore[attr-defined]
        f.jobs_running, f.jobs_failed = c["Running"], c["Failed"]  # type: ignore[attr-defined]


def flow_detail(flow: Flow, with_logs: bool = False) -> dict[str, Any]:
    """The flow page: its steps with the jobs of their current attempt (a retry's earlier
    failed jobs are counted apart), why each waiting step waits, the graph and events."""
    steps = list(flow.steps.select_related("template").order_by("position"))
    jobs = list(flow.jobs.only("id", "name", "state", "step_id", "item_index", "hold_reason",
                               "pending_message").order_by("id"))  # fmt: skip
    by_id = {s.pk: s for s in steps}
    current: dict[int, list[Job]] = defaultdict(list)
    earlier: Counter[int] = Counter()
    for job in jobs:
        step = by_id.get(job.step_id or 0)
        if step is not None and step.is_current(job):
            current[step.pk].append(job)
        elif step is not None:
            earlier[step.pk] += 1
    waiting = step_wait_reasons(flow, steps, jobs)
    rows = [{"step": s, "jobs": current[s.pk], "earlier": earlier[s.pk],
             "total": len(s.items) if s.items else 1, "waiting": waiting[s.name]}
            for s in steps]  # fmt: skip
    context = {"flow": flow, "rows": rows, "dag": layout(steps, current, waiting),
               "legend": LEGEND,
               "events": list(Event.objects.filter(flow=flow).order_by("-id")[:30])}  # fmt: skip
    if with_logs:
        context["log_text"] = logs.flow_tail(flow)
    return context
