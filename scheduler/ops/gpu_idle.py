"""GPUs held idle: jobs that hold GPUs at ~0 % for BERTH_GPU_IDLE_MINUTES are flagged (issue
#22, after Princeton jobstats' idle-GPU flags; docs/metrics.md#gpus-held-idle).

- Measuring (`observe`, from a lease renewal): a lease lists, for each running task holding
  GPUs, `gpu_utilization`: its GPUs' mean utilisation in the sample that lease carries. A
  task below IDLE_PERCENT gets `Task.gpu_idle_since` (the server's time of the first idle
  lease), a busy one loses it, and so does one whose GPUs could not be read (null). Written
  only when that changes, so a lease at rest costs one read (task rows are watched by the
  scheduler loop's change marks: a write there makes the next cycle a full one).
- Flagging (`flag_idle_jobs`, the scheduler loop's housekeeping, at most every CHECK_SECONDS):
  a running job with a running task idle that long gets `Job.gpu_idle_since` and one event
  `JobGpuIdle` (reason `GpusIdle`). A flagged job none of whose running tasks is idle that
  long any more is cleared with an event `JobGpuBusy` (reason `GpusBusy`); one that stopped
  running is cleared without an event (its own events say why). Each change is a conditional
  UPDATE whose row count decides the event, so an idle stretch is flagged once, whatever the
  number of cycles or schedulers. BERTH_GPU_IDLE_MINUTES 0 turns flagging off (and clears
  the flags).
- An idle mark older than its task's `started_at` belongs to an earlier attempt (a retry
  reuses the row): it counts as no mark.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from scheduler import notify
from scheduler.models import Event, Job, Node, Task
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import JobState, TaskState

IDLE_PERCENT = 1.0  # a task's GPUs below this mean utilisation are idle
CHECK_SECONDS = 10.0  # between the scheduler loop's checks: the rule counts in minutes
MAX_MINUTES = 366 * 24 * 60.0  # a longer setting means a year (timedelta has its limits)
_checked_at = -math.inf


def observe(node: Node, utilization: Mapping[int, float | None], now: datetime) -> int:
    """Keep since when each of `node`'s running GPU tasks in `utilization` (task id -> mean
    %, validated by the protocol) has been idle. None: its GPUs could not be read, so a mark
    is dropped (a stretch is judged on measurements only: a first 0 % while a job loads its
    data must not become a flag because NVML then broke). Tasks of other nodes, tasks that
    are not running and tasks holding no GPU are ignored. Returns how many rows changed."""
    if not utilization:
        return 0
    rows = Task.objects.filter(
        pk__in=list(utilization), node=node, state=TaskState.RUNNING, gpu__gt=0
    ).values_list("pk", "gpu_idle_since", "started_at")
    went_idle, went_busy = [], []
    for pk, since, started in rows:
        if since is not None and started is not None and since < started:
            since = None  # an earlier attempt's mark
        value = utilization[pk]
        idle = value is not None and value < IDLE_PERCENT
        if idle and since is None:
            went_idle.append(pk)
        elif not idle and since is not None:
            went_busy.append(pk)
    if went_idle:
        # Not over a fresher mark: a concurrent lease of the same node may have set one.
        unmarked = Q(gpu_idle_since=None) | Q(gpu_idle_since__lt=F("started_at"))
        Task.objects.filter(unmarked, pk__in=went_idle).update(gpu_idle_since=now)
    if went_busy:
        Task.objects.filter(pk__in=went_busy).update(gpu_idle_since=None)
    return len(went_idle) + len(went_busy)


@dataclass
class _Idle:
    """A running job's tasks idle past the limit: the earliest mark, and which tasks."""

    since: datetime
    flow_id: int | None
    tasks: list[str] = field(default_factory=list)


def _idle_jobs(cutoff: datetime) -> dict[int, _Idle]:
    found: dict[int, _Idle] = {}
    rows = (
        Task.objects.filter(
            state=TaskState.RUNNING, gpu__gt=0, job__state=JobState.RUNNING,
            gpu_idle_since__lte=cutoff, gpu_idle_since__gte=F("started_at"),
        )
        .order_by("job_id", "group", "index")
        .values_list("job_id", "group", "index", "gpu_idle_since", "node__name", "job__flow_id")
    )  # fmt: skip
    for job_id, group, index, since, node, flow_id in rows:
        assert since is not None  # filtered on it
        idle = found.setdefault(job_id, _Idle(since, flow_id))
        idle.since = min(idle.since, since)
        idle.tasks.append(f"{group}-{index} on {node}")
    return found


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _flag(job_id: int, idle: _Idle, now: datetime) -> bool:
    with transaction.atomic():
        claimed = Job.objects.filter(pk=job_id, state=JobState.RUNNING, gpu_idle_since=None).update(
            gpu_idle_since=idle.since
        )
        if not claimed:
            return False
        held = _minutes((now - idle.since).total_seconds())
        message = (
            f"{', '.join(idle.tasks)}: GPUs below {IDLE_PERCENT:g} % for {held}"
            f" (limit {settings.BERTH_GPU_IDLE_MINUTES:g} min)"
        )
        Event.objects.create(kind=EventKind.JOB_GPU_IDLE, reason=Reason.GPUS_IDLE, message=message,
                             job_id=job_id, flow_id=idle.flow_id)  # fmt: skip
        notify.changed(jobs=[job_id])
    return True


def _clear(job: Job, now: datetime, say: bool) -> bool:
    """Unflag `job` (as read: its flag unchanged since); an event when `say`."""
    with transaction.atomic():
        cleared = Job.objects.filter(pk=job.pk, gpu_idle_since=job.gpu_idle_since).update(
            gpu_idle_since=None
        )
        if not cleared:
            return False
        if say and job.state == JobState.RUNNING and job.gpu_idle_since is not None:
            held = _minutes((now - job.gpu_idle_since).total_seconds())
            Event.objects.create(kind=EventKind.JOB_GPU_BUSY, reason=Reason.GPUS_BUSY,
                                 message=f"its GPUs are in use again after {held} idle",
                                 job_id=job.pk, flow_id=job.flow_id)  # fmt: skip
        notify.changed(jobs=[job.pk])
    return True


def flag_idle_jobs(now: datetime | None = None) -> int:
    """One unit of the scheduler loop: flag the running jobs holding GPUs idle past
    BERTH_GPU_IDLE_MINUTES, clear those busy again or stopped. Returns the flags changed."""
    now = now or timezone.now()
    minutes = min(float(settings.BERTH_GPU_IDLE_MINUTES), MAX_MINUTES)
    idle = _idle_jobs(now - timedelta(minutes=minutes)) if minutes > 0 else {}
    flagged = Job.objects.filter(gpu_idle_since__isnull=False).only(
        "pk", "state", "gpu_idle_since", "flow_id"
    )
    changed = 0
    for job in flagged:
        if job.pk in idle and job.state == JobState.RUNNING:
            del idle[job.pk]  # flagged already: once per idle stretch
        else:
            changed += _clear(job, now, say=minutes > 0)
    for job_id, stretch in idle.items():
        changed += _flag(job_id, stretch, now)
    return changed


def flag_if_due() -> int:
    """The scheduler loop's unit: check at most once every CHECK_SECONDS."""
    global _checked_at
    if time.monotonic() - _checked_at < CHECK_SECONDS:
        return 0
    _checked_at = time.monotonic()
    return flag_idle_jobs()
