"""Usage accounting, written when things end and never recomputed from live rows.

`record_task_ends` is called in the transaction that ends a task attempt (an agent's report in
scheduler/agentapi/report.py, a lost node in scheduler/lifecycle/); `record_job_end` (or
`record_jobs_end` for a set-based write) where a job reaches a final state
(scheduler/lifecycle/). Both are idempotent per attempt / cheap
single-row updates, and write nothing that refers to the job by foreign key.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, F, Q, QuerySet, Sum

from scheduler.models import FinishedJobCount, Job, Queue, Task, UsageRecord


def record_task_ends(tasks: Iterable[Task], now: datetime, state: str | None = None,
                     measured: dict[int, dict[str, Any]] | None = None) -> int:  # fmt: skip
    """Record what each ended attempt used: wall time from its start to `now` (or its own
    finish time), cpu-seconds = millicores x seconds / 1000, gpu-seconds = devices x seconds
    (a fraction of one GPU counts as that fraction: 0.25 GPU for an hour is 900 gpu-seconds).
    Attempts that never started used nothing and leave no record. `state` overrides the
    tasks' own state (for callers that ended them with a bulk update). `measured` (task id ->
    the agent's `usage` of its end) adds what the node measured: peak memory, CPU seconds
    used, GPU utilisation."""
    measured = measured or {}
    started = [t for t in tasks if t.started_at is not None]
    if not started:
        return 0
    jobs = _owners_and_queues(started)
    records = []
    for task in started:
        if task.job_id not in jobs:
            continue
        owner_id, username, queue = jobs[task.job_id]
        finished = task.finished_at if state is None and task.finished_at else now
        start = _start(task, finished)
        wall = max(0.0, (finished - start).total_seconds())
        records.append(
            UsageRecord(
                user_id=owner_id, username=username, queue=queue, job_id=task.job_id,
                task_id=task.pk, attempt=task.attempt, state=state or task.state,
                started_at=start, finished_at=finished,
                day=finished.astimezone(UTC).date(), wall_seconds=wall,
                cpu_seconds=task.cpu * wall / 1000, gpu_seconds=gpus_held(task) * wall,
                memory=task.memory, **_measured(measured.get(task.pk, {})),
            )
        )  # fmt: skip
    # A report re-sent for an attempt already recorded is ignored, never counted twice.
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True)
    return len(records)


def gpus_held(task: Task) -> float:
    """The GPUs a task holds: its whole devices, or its fraction of one."""
    return task.gpu_share / 1000 if task.gpu_share else task.gpu


def _measured(usage: dict[str, Any]) -> dict[str, Any]:
    """UsageRecord fields from an agent's measured `usage` (absent: not measured)."""
    return {
        "peak_memory": usage.get("peak_memory"),
        "used_cpu_seconds": usage.get("cpu_seconds"),
        "gpu_utilization": usage.get("gpu_utilization"),
    }


def efficiency(record: UsageRecord) -> dict[str, float | None]:
    """As Slurm's seff: CPU efficiency = CPU seconds used / (cores requested x wall time),
    memory efficiency = peak / requested, GPU utilisation as measured; None when unknown."""
    cpu = None
    if record.used_cpu_seconds is not None and record.cpu_seconds > 0:
        cpu = round(100 * record.used_cpu_seconds / record.cpu_seconds, 1)
    memory = None
    if record.peak_memory is not None and record.memory > 0:
        memory = round(100 * record.peak_memory / record.memory, 1)
    return {"cpu_percent": cpu, "memory_percent": memory, "gpu_percent": record.gpu_utilization}


def usage_view(record: UsageRecord) -> dict[str, Any]:
    """One attempt's use, as `berth show`, the job page and the API show it."""
    return {
        "wall_seconds": round(record.wall_seconds, 3),
        "cpu_seconds": round(record.cpu_seconds, 3),  # cores requested x wall time
        "used_cpu_seconds": _rounded(record.used_cpu_seconds),
        "memory": record.memory,
        "peak_memory": record.peak_memory,
        "gpu_utilization": _rounded(record.gpu_utilization),
        **efficiency(record),
    }


def usage_by_attempt(job_ids: Iterable[int]) -> dict[tuple[int, int], UsageRecord]:
    """(task id, attempt) -> its usage record, for these jobs' ended attempts."""
    records = UsageRecord.objects.filter(job_id__in=list(job_ids))
    return {(r.task_id, r.attempt): r for r in records}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _owners_and_queues(tasks: list[Task]) -> dict[int, tuple[int, str, str]]:
    """job id -> (owner id, username, queue name): from the rows the caller already loaded
    with the tasks (`select_related("job__owner", "job__queue")`), else in one query."""
    jobs: dict[int, tuple[int, str, str]] = {}
    for task in tasks:
        if Task.job.is_cached(task):  # type: ignore[attr-defined]
            job = task.job
            if Job.owner.is_cached(job) and Job.queue.is_cached(job):  # type: ignore[attr-defined]
                jobs[job.pk] = (job.owner_id, job.owner.username, job.queue.name)
    missing = {t.job_id for t in tasks} - jobs.keys()
    if missing:
        rows = Job.objects.filter(pk__in=missing).values_list(
            "id", "owner_id", "owner__username", "queue__name"
        )
        jobs.update((job_id, (owner, username, queue)) for job_id, owner, username, queue in rows)
    return jobs


def _start(task: Task, finished: datetime) -> datetime:
    """When the attempt's usage starts: its reported start; but a task that started and ended
    between two heartbeats was never reported running (the server then sets its start to its
    end), so it counts from when its resources were bound to it instead of as nothing."""
    assert task.started_at is not None
    if task.started_at >= finished and task.assigned_at is not None:
        return min(task.assigned_at, finished)
    return task.started_at


def record_job_end(job: Job, state: str) -> None:
    """Count one job reaching final `state` in its queue."""
    queue = Queue.objects.filter(pk=job.queue_id).values_list("name", flat=True).first() or ""
    _count_finished(queue, state, 1)


def record_jobs_end(job_ids: Iterable[int], state: str) -> None:
    """Count jobs that reached final `state` together (a set-based write), per queue."""
    per_queue = Job.objects.filter(pk__in=list(job_ids)).values_list("queue__name")
    for queue, n in per_queue.annotate(n=Count("id")).order_by():
        _count_finished(queue or "", state, n)


def _count_finished(queue: str, state: str, n: int) -> None:
    counter = FinishedJobCount.objects.filter(queue=queue, state=state)
    if counter.update(count=F("count") + n):
        return
    try:
        with transaction.atomic():
            FinishedJobCount.objects.create(queue=queue, state=state, count=n)
    except IntegrityError:  # created meanwhile by another process
        counter.update(count=F("count") + n)


# --- reading it back ----------------------------------------------------------------------

GROUPS = ("user", "queue", "day")
_GROUP_FIELDS = {"user": "username", "queue": "queue", "day": "day"}
MAX_SPAN_DAYS = 400


class UsageQueryError(ValueError):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


def _moment(name: str, raw: str, errors: dict[str, list[str]]) -> datetime | None:
    """An ISO 8601 time (UTC when it names no zone) or a date: midnight UTC starting it for
    `since`, ending it for `until`, so since=2026-11-01&until=2026-11-30 is all of November."""
    text = raw.strip()
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00")) if len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None:
        errors[name] = ["expected a date (2026-11-01) or an ISO 8601 time"]
        return None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        if name == "until" and len(text) == len("2026-11-30"):
            value += timedelta(days=1)
        value.astimezone(UTC) - timedelta(days=MAX_SPAN_DAYS + 31)  # room for the defaults
    except (OverflowError, ValueError):
        errors[name] = ["out of range"]
        return None
    return value


def parse_usage_query(
    params: dict[str, str], now: datetime
) -> tuple[datetime, datetime, list[str]]:
    """since, until, group_by from query parameters; every bad one is named at once."""
    errors: dict[str, list[str]] = {}
    until = _moment("until", params["until"], errors) if params.get("until") else now
    since = (
        _moment("since", params["since"], errors)
        if params.get("since")
        else (until or now) - timedelta(days=30)
    )
    group_by = [g.strip() for g in (params.get("group_by") or "user").split(",") if g.strip()]
    unknown = [g for g in group_by if g not in GROUPS]
    if unknown or not group_by or len(set(group_by)) != len(group_by):
        errors["group_by"] = [f"a comma-separated choice of {', '.join(GROUPS)}, each once"]
    if since is not None and until is not None and not errors:
        if since >= until:
            errors["since"] = ["must be before until"]
        elif until - since > timedelta(days=MAX_SPAN_DAYS):
            errors["since"] = [f"at most {MAX_SPAN_DAYS} days before until"]
    if errors:
        raise UsageQueryError(errors)
    assert since is not None and until is not None
    return since, until, group_by


# Over the attempts whose node measured them: what they used and what they asked for.
_MEASURED_SUMS = {
    "used_cpu": Sum("used_cpu_seconds"),
    "asked_cpu": Sum("cpu_seconds", filter=Q(used_cpu_seconds__isnull=False)),
    "peak": Sum("peak_memory"),
    "asked_memory": Sum("memory", filter=Q(peak_memory__isnull=False)),
    "gpu_util": Avg("gpu_utilization"),
}


def _group_efficiency(row: dict[str, Any]) -> dict[str, float | None]:
    """A group's efficiency as seff gives it, over its measured attempts (None: none was)."""

    def percent(used: float | None, asked: float | None) -> float | None:
        return round(100 * used / asked, 1) if used is not None and asked else None

    return {
        "used_cpu_seconds": None if row["used_cpu"] is None else round(row["used_cpu"], 3),
        "cpu_percent": percent(row["used_cpu"], row["asked_cpu"]),
        "memory_percent": percent(row["peak"], row["asked_memory"]),
        "gpu_percent": None if row["gpu_util"] is None else round(row["gpu_util"], 1),
    }


def usage_rows(records: QuerySet[UsageRecord], group_by: list[str]) -> list[dict[str, Any]]:
    """Sums per group: jobs (distinct), task attempts, cpu/gpu/wall seconds, GPU-hours."""
    fields = [_GROUP_FIELDS[g] for g in group_by]
    rows = (
        records.values(*fields)
        .annotate(**_MEASURED_SUMS)  # first: its cpu_seconds is the field, not the sum below
        .annotate(
            jobs=Count("job_id", distinct=True),
            tasks=Count("id"),
            cpu_seconds=Sum("cpu_seconds"),
            gpu_seconds=Sum("gpu_seconds"),
            wall_seconds=Sum("wall_seconds"),
        )  # fmt: skip
        .order_by(*fields)
    )
    out = []
    for row in rows:
        item: dict[str, Any] = {g: row[_GROUP_FIELDS[g]] for g in group_by}
        if "day" in item:
            item["day"] = item["day"].isoformat()
        item.update(
            jobs=row["jobs"], tasks=row["tasks"], cpu_seconds=round(row["cpu_seconds"], 3),
            gpu_seconds=round(row["gpu_seconds"], 3), wall_seconds=round(row["wall_seconds"], 3),
            gpu_hours=round(row["gpu_seconds"] / 3600, 4), **_group_efficiency(row),
        )  # fmt: skip
        out.append(item)
    return out
