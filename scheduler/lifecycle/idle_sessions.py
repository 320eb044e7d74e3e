"""Idle interactive GPU sessions are warned, then ended (issue #24; docs/interactive.md).

An interactive job — a `berth shell` (spec `interactive`) or a web app (spec `apps`) — that
holds GPUs is idle while every one of its running GPU tasks has been below IDLE_PERCENT
since its agent's leases said so (`Task.gpu_idle_since`, scheduler/ops/gpu_idle.py) AND none
of its terminal sessions got input (`ShellSession.last_input_at`, written by the agent's
socket, scheduler/agentapi/terminal.py; a session's opening counts as input, and so does the
job's start) AND its owner did not use its web app (`Job.app_used_at`, written by the app
proxy, berth/web/appproxy.py `note_use`: the user's websocket messages and requests that
change something; reads are not use). The stretch starts at the latest of these.

- Idle for its queue's `interactive_gpu_idle_minutes` (0: never): warned once — the job's
  `idle_warned_at` and `idle_ends_at` (now + BERTH_IDLE_SESSION_GRACE_MINUTES), an event
  `SessionIdleWarning` (reason `GpusIdle`), a notification through the outbox on each of the
  owner's channels, a line in its open terminals.
- Used again (input or use of its app after the warning, or a GPU busy): the warning is
  withdrawn with an event `SessionIdleCleared` (reason `TerminalInput`, `AppRequest` or
  `GpusBusy`) and a line in its terminals.
- Still idle at `idle_ends_at`: ended through the job state machine as a deadline ends a job
  (`terminate_job`: the agents kill its tasks, the job ends Cancelled), with the reason
  `GpuIdleTimeout`.

Batch jobs are never ended here: gpu_idle.py only flags them. Each change is a conditional
UPDATE (or a row lock) whose outcome decides the event, so a warning, its withdrawal and the
end happen once, whatever the number of checks or schedulers. A job no longer a candidate
(it stopped running, holds no GPU any more, its queue's limit went to 0) loses its warning
without an event.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Max, Q
from django.utils import timezone

from scheduler import notify, outbox
from scheduler.jobs.events import record
from scheduler.lifecycle.transitions import terminate_job
from scheduler.models import Job, ShellSession, Task
from scheduler.ops.gpu_idle import IDLE_PERCENT, MAX_MINUTES
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import JobState, TaskState

CHECK_SECONDS = 10.0  # between the scheduler loop's checks: the limits count in minutes
INTERACTIVE = Q(spec__has_key="interactive") | Q(spec__has_key="apps")
_checked_at = -math.inf


@dataclass
class _Stretch:
    """Since when a job's GPUs have all been idle (None: one is busy or unread), since when
    its terminals have had no input, and its app's latest request (None: none)."""

    gpus: datetime | None
    input: datetime
    app: datetime | None = None

    @property
    def since(self) -> datetime | None:
        if self.gpus is None:
            return None
        return max(self.gpus, self.input, self.app or self.input)

    @property
    def used(self) -> tuple[Reason, str]:
        """What used the job last, as a warning's withdrawal names it."""
        if self.gpus is None:
            return Reason.GPUS_BUSY, "its GPUs are in use again"
        if self.app is not None and self.app > self.input:
            return Reason.APP_REQUEST, "its app was used"
        return Reason.TERMINAL_INPUT, "its terminal got input"


def _candidates() -> list[Job]:
    """Running interactive jobs holding GPUs in queues with a limit."""
    jobs = Job.objects.filter(
        INTERACTIVE, state=JobState.RUNNING, queue__interactive_gpu_idle_minutes__gt=0,
        pk__in=Task.objects.filter(state=TaskState.RUNNING, gpu__gt=0).values("job_id"),
    )  # fmt: skip
    return list(
        jobs.select_related("queue").only(
            "pk", "name", "state", "started_at", "flow_id", "owner_id", "idle_warned_at",
            "idle_ends_at", "app_used_at", "queue__name", "queue__interactive_gpu_idle_minutes",
        ).annotate(has_app=ExpressionWrapper(Q(spec__has_key="apps"), BooleanField()))
    )  # fmt: skip


def _stretches(jobs: list[Job]) -> dict[int, _Stretch]:
    ids = [job.pk for job in jobs]
    marks: dict[int, list[datetime | None]] = {}
    tasks = Task.objects.filter(job_id__in=ids, state=TaskState.RUNNING, gpu__gt=0)
    for job_id, since, started in tasks.values_list("job_id", "gpu_idle_since", "started_at"):
        valid = since is not None and (started is None or since >= started)  # this attempt's
        marks.setdefault(job_id, []).append(since if valid else None)
    gpus: dict[int, datetime | None] = {}
    for job_id, found in marks.items():
        idle = [mark for mark in found if mark is not None]  # all of them, or one is busy
        gpus[job_id] = max(idle) if len(idle) == len(found) else None
    typed = {
        row["job_id"]: [row["opened"], row["typed"]]
        for row in ShellSession.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(opened=Max("opened_at"), typed=Max("last_input_at"))
    }
    stretches = {}
    for job in jobs:
        times = [t for t in [job.started_at, *typed.get(job.pk, [])] if t is not None]
        stretches[job.pk] = _Stretch(
            gpus.get(job.pk), max(times, default=timezone.now()), job.app_used_at
        )
    return stretches


def _open_terminals(job_id: int) -> list[str]:
    """The users' socket channels of the job's open sessions."""
    sessions = ShellSession.objects.filter(job_id=job_id, state=ShellSession.State.OPEN)
    return list(sessions.values_list("client_channel", flat=True))


def _has_app(job: Job) -> bool:
    return bool(getattr(job, "has_app", False))


def _unused(job: Job) -> str:
    return "no terminal input or app request" if _has_app(job) else "no terminal input"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _limit(job: Job) -> float:
    return min(float(job.queue.interactive_gpu_idle_minutes), MAX_MINUTES)


def _warn(job: Job, since: datetime, now: datetime) -> bool:
    grace = min(float(settings.BERTH_IDLE_SESSION_GRACE_MINUTES), MAX_MINUTES)
    ends = now + timedelta(minutes=grace)
    with transaction.atomic():
        claimed = Job.objects.filter(pk=job.pk, state=JobState.RUNNING, idle_warned_at=None).update(
            idle_warned_at=now, idle_ends_at=ends
        )
        if not claimed:
            return False
        held = _minutes((now - since).total_seconds())
        why = (
            f"its GPUs have been below {IDLE_PERCENT:g} % with {_unused(job)} for {held}"
            f" (queue {job.queue.name}: {_limit(job):g} min)"
        )
        end = f"it will be ended at {ends:%Y-%m-%d %H:%M:%S} UTC"
        use = "its app or terminal is used" if _has_app(job) else "its terminal gets input"
        message = f"{why}; {end} unless {use} or its GPUs are used"
        record(EventKind.SESSION_IDLE_WARNING, Reason.GPUS_IDLE, message, job=job)
        text = f"Berth: job {job.pk} ({job.name}): {message}"
        outbox.enqueue_idle_warning(job.pk, text)
        notify.terminal_notice(_open_terminals(job.pk), text)
        notify.changed(jobs=[job.pk])
    return True


def _clear(job: Job, stretch: _Stretch | None, now: datetime) -> bool:
    """Withdraw the job's warning (as read: unchanged since); an event when `stretch` says
    why (None: the job is no longer a candidate)."""
    with transaction.atomic():
        cleared = Job.objects.filter(pk=job.pk, idle_warned_at=job.idle_warned_at).update(
            idle_warned_at=None, idle_ends_at=None
        )
        if not cleared:
            return False
        if stretch is not None:
            reason, what = stretch.used
            message = f"{what}: it will not be ended for idle GPUs"
            record(EventKind.SESSION_IDLE_CLEARED, reason, message, job=job)
            notify.terminal_notice(_open_terminals(job.pk), f"Berth: job {job.pk}: {message}")
        notify.changed(jobs=[job.pk])
    return True


def _end(job: Job, since: datetime, now: datetime) -> bool:
    with transaction.atomic():
        fresh = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        if fresh.state != JobState.RUNNING or fresh.idle_warned_at != job.idle_warned_at:
            return False
        held = _minutes((now - since).total_seconds())
        message = (
            f"ended: its GPUs were below {IDLE_PERCENT:g} % with {_unused(job)} for {held}"
            f" (queue {job.queue.name}: {_limit(job):g} min, then warned)"
        )
        notify.terminal_notice(_open_terminals(job.pk), f"Berth: job {job.pk} {message}")
        fresh.idle_warned_at = fresh.idle_ends_at = None
        terminate_job(fresh, final_state=JobState.CANCELLED, reason=Reason.GPU_IDLE_TIMEOUT,
                      message=message, now=now)  # fmt: skip
    return True


def _judge(job: Job, stretch: _Stretch, now: datetime) -> bool:
    """Warn, withdraw or end one candidate; whether anything changed."""
    since = stretch.since
    idle = since is not None and now - since >= timedelta(minutes=_limit(job))
    if job.idle_warned_at is None:
        return since is not None and idle and _warn(job, since, now)
    if not idle or since is None or since > job.idle_warned_at:  # used since the warning
        return _clear(job, stretch, now)
    if job.idle_ends_at is not None and job.idle_ends_at <= now:
        return _end(job, since, now)
    return False


def check_sessions(now: datetime | None = None) -> int:
    """One unit of the scheduler loop: warn the idle interactive GPU jobs, withdraw the
    warnings of those used again, end those still idle past their warning. Returns how many
    jobs changed."""
    now = now or timezone.now()
    jobs = _candidates()
    stretches = _stretches(jobs) if jobs else {}
    changed = sum(_judge(job, stretches[job.pk], now) for job in jobs)
    stale = Job.objects.filter(idle_warned_at__isnull=False).exclude(pk__in=[j.pk for j in jobs])
    for job in stale.only("pk", "idle_warned_at"):
        changed += _clear(job, None, now)
    return changed


def check_if_due() -> int:
    """The scheduler loop's unit: check at most once every CHECK_SECONDS."""
    global _checked_at
    if time.monotonic() - _checked_at < CHECK_SECONDS:
        return 0
    _checked_at = time.monotonic()
    return check_sessions()
