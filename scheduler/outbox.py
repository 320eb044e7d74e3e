"""Notifications enter the outbox here, in the transaction of what they tell of.

Every job state change is written with a `JobStateChanged` event whose message starts with
`OLD -> NEW` (scheduler/lifecycle/transitions.py, scheduler/cycle/store.py,
scheduler/jobs/arrays.py, scheduler/lifecycle/sync.py); `Event.save` and
`Event.objects.bulk_create` hand every new event to `enqueue_for_events`, so the outbox is
fed from one place whichever writer moved the job, and a transaction that rolls back leaves
no notification behind. Time-limit warnings are not state changes: `enqueue_time_limits`
finds running jobs past N % of their walltime, or N minutes from its end (run by the
notifier, scheduler/notifications/delivery.py); a partial unique index makes each fire once.
A job with a web app is warned 10 and 1 minutes before its walltime unless it or its owner
chose events. An interactive job about to be ended for holding GPUs idle
(`session_idle`, `enqueue_idle_warning`) is told on every channel its owner has.

What a job's owner is told of: the job's own `notify` (its spec) or else the user's defaults
(NotifyPreference). Array elements are not notified one by one: the array's parent is (it
starts with its first element and ends with its last)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from scheduler.intake.specs import NOTIFY_EVENTS, notify_events
from scheduler.models import Event, Job, Outbox
from scheduler.states.codes import EventKind
from scheduler.states.names import JobState

STATE_CHANGE = re.compile(r"(\w+) -> (\w+)")
# The new state -> the notification kinds it may send, the first one wanted wins (a failed
# job sends `fail` to whoever asked for it, else `end`: one message, not two).
KINDS_INTO: dict[str, tuple[str, ...]] = {
    JobState.RUNNING: ("begin",),
    JobState.SUCCEEDED: ("end",),
    JobState.CANCELLED: ("end",),
    JobState.FAILED: ("fail", "end"),
}
# time_limit_N: N % of the walltime used; time_limit_Nm: N minutes of it left.
TIME_LIMITS = tuple(
    int(e[11:]) for e in NOTIFY_EVENTS if e.startswith("time_l") and e[11:].isdigit()
)
MINUTES_LEFT = {
    e: 60 * int(e[11:-1]) for e in NOTIFY_EVENTS if e.startswith("time_l") and e.endswith("m")
}
# What a job with a web app (an interactive job, spec `apps`) is warned of when neither it
# nor its owner chose any events: its time running out, as a session about to expire.
INTERACTIVE_DEFAULTS = {"time_limit_10m", "time_limit_1m"}
VERBS = {"begin": "started", "end": "ended", "fail": "failed"}
IDLE_WARNING = "session_idle"  # an interactive job about to be ended for idle GPUs


def enqueue_for_events(events: Iterable[Event]) -> int:
    """Outbox rows for the job state changes among `events` that their owners asked to be
    told of; returns how many were written."""
    into: dict[int, tuple[str, str]] = {}  # job -> (its new state, why)
    for event in events:
        if event.kind != EventKind.JOB_STATE_CHANGED or event.job_id is None:
            continue
        match = STATE_CHANGE.match(event.message)
        if match and match[1] != match[2] and match[2] in KINDS_INTO:
            into[event.job_id] = (match[2], event.message[match.end() :].lstrip(": "))
    if not into:
        return 0
    # The row may not hold the new state yet (move_job writes the event before its caller
    # saves the job): the state and message come from the event.
    jobs = _jobs(Job.objects.filter(pk__in=sorted(into), array_parent__isnull=True))
    wanted = _wanted(jobs)
    rows = []
    for job in jobs:
        state, job["message"] = into[job["id"]]
        kind = next((k for k in KINDS_INTO[state] if k in wanted[job["id"]]), None)
        if kind is not None:
            rows += _rows(job, kind, state)
    if rows:
        Outbox.objects.bulk_create(rows)
    return len(rows)


def enqueue_time_limits(now: datetime | None = None) -> int:
    """Warnings for running jobs past N % of their walltime whose owners asked for
    `time_limit_N` (each once per job and channel); returns how many rows were new."""
    now = now or timezone.now()
    running = Job.objects.filter(state=JobState.RUNNING, array_parent__isnull=True,
                                 walltime__isnull=False, started_at__isnull=False)  # fmt: skip
    # Only jobs whose notify (or, without one, whose owner's defaults) names a time limit.
    asked = Q(spec__notify__icontains="time_limit_") | (
        ~Q(spec__has_key="notify")
        & (Q(owner__notify_preference__events__contains="time_limit_") | Q(spec__has_key="apps"))
    )
    jobs = _jobs(running.filter(asked))
    wanted = _wanted(jobs)
    rows = []
    for job in jobs:
        elapsed = (now - job["started_at"]).total_seconds()
        for kind, value in _time_limits_reached(elapsed, job["walltime"]):
            if kind in wanted[job["id"]]:
                rows += _rows(job, kind, value)
    if not rows:
        return 0
    done = set(
        Outbox.objects.filter(
            job_id__in={r.job_id for r in rows}, kind__startswith="time_limit_"
        ).values_list("job_id", "kind", "channel")
    )
    rows = [r for r in rows if (r.job_id, r.kind, r.channel) not in done]
    # A notifier beside this one may write the same row first: the unique index keeps one.
    Outbox.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def enqueue_idle_warning(job_id: int, text: str) -> int:
    """Warn the owner of interactive job `job_id` that it is about to be ended for holding
    GPUs idle with no terminal input (scheduler/ops/idle_sessions.py): on each channel the
    owner has, whatever events they chose, as the job ends by policy rather than by its own
    doing. Written in the transaction that marks the job warned, so once per warning."""
    jobs = _jobs(Job.objects.filter(pk=job_id))
    if not jobs:
        return 0
    _wanted(jobs)  # sets each job's channels
    rows = _rows(jobs[0], IDLE_WARNING, jobs[0]["state"], text=text)
    Outbox.objects.bulk_create(rows)
    return len(rows)


def _time_limits_reached(elapsed: float, walltime: int) -> list[tuple[str, str]]:
    """The time-limit warnings a job `elapsed` seconds into its walltime has reached, with
    what each says (a percentage, or minutes). A warning of N minutes left is for jobs that
    had more than that to begin with: a 30-second job is not told it has a minute left."""
    reached = [(f"time_limit_{p}", str(p)) for p in TIME_LIMITS if elapsed * 100 >= p * walltime]
    return reached + [
        (kind, str(seconds // 60))
        for kind, seconds in MINUTES_LEFT.items()
        if walltime > seconds and walltime - elapsed <= seconds
    ]


def _jobs(queryset: Any) -> list[dict[str, Any]]:
    """The jobs with their `notify` and their owners' settings, in one query (this runs in
    every batch of state changes the scheduler writes)."""
    return list(
        queryset.annotate(notify=KeyTransform("notify", "spec"), apps=KeyTransform("apps", "spec"))
        .values(
            "id", "name", "owner_id", "state", "message", "walltime", "started_at", "notify",
            "apps", "owner__email", "owner__notify_preference__events",
            "owner__notify_preference__email", "owner__notify_preference__webhook_url",
        )
    )  # fmt: skip


def _wanted(jobs: list[dict[str, Any]]) -> dict[int, set[str]]:
    """The events each job's owner wants told of, and where (set as `job["channels"]`): the
    job's own `notify` if it has one, else the owner's defaults (none without any)."""
    wanted: dict[int, set[str]] = {}
    for job in jobs:
        own = job["notify"] if isinstance(job["notify"], dict) else None
        email_on = job["owner__notify_preference__email"]  # None: no NotifyPreference
        defaults = notify_events(job["owner__notify_preference__events"] or "")[0]
        wanted[job["id"]] = set(own["events"] if own else defaults)
        if not own and not defaults and job["apps"]:
            wanted[job["id"]] |= INTERACTIVE_DEFAULTS
        settings = {"email": job["owner__email"] or "", "email_on": email_on in (None, True),
                    "webhook": job["owner__notify_preference__webhook_url"] or ""}  # fmt: skip
        job["channels"] = _channels(own, settings)
    return wanted


def _channels(own: dict[str, Any] | None, settings: dict[str, Any]) -> dict[str, str]:
    """Where to send: {"email": address, "webhook": URL}, each only when set. The job's own
    `email` (true or false) wins over the account's setting."""
    wanted = (own or {}).get("email")
    email = settings["email"] if (settings["email_on"] if wanted is None else wanted) else ""
    webhook = (own or {}).get("webhook") or settings["webhook"]
    return {k: v for k, v in (("email", email), ("webhook", webhook)) if v}


def _rows(job: dict[str, Any], kind: str, state: str, text: str = "") -> list[Outbox]:
    """One row per channel of the job's owner. `state` is the state the job moved into (for
    a time-limit warning: the percentage); `text` what to say, if not the usual line."""
    text = text or _text(job, kind, state)
    payload = {"text": text, "job": job["id"], "name": job["name"], "event": kind,
               "state": job["state"] if kind.startswith("time_limit_") else state,
               "message": job["message"]}  # fmt: skip
    now = timezone.now()
    return [
        Outbox(
            user_id=job["owner_id"],
            job_id=job["id"],
            job_ref=str(job["id"]),
            kind=kind,
            channel=channel,
            target=target,
            text=text,
            payload=payload,
            next_attempt_at=now,
        )  # fmt: skip
        for channel, target in job["channels"].items()
    ]


def _text(job: dict[str, Any], kind: str, state: str) -> str:
    """One line for people (and Slack's `text`)."""
    name = f"job {job['id']} ({job['name']})"
    if kind in MINUTES_LEFT:
        more = f"berth extend {job['id']} --by 30m gives it more, if its queue allows"
        return f"Berth: {name} has {state} min left of its walltime ({job['walltime']} s); {more}"
    if kind.startswith("time_limit_"):
        return f"Berth: {name} has used {state} % of its walltime ({job['walltime']} s)"
    why = f": {job['message']}" if job["message"] and kind != "begin" else ""
    return f"Berth: {name} {VERBS[kind]} ({state}){why}"[:1000]
