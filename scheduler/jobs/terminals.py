"""Terminal sessions in running tasks (docs/interactive.md), on the rows: who may open one,
the order for the task's agent, the agent's claim, the close and what it means for the job.

Every open and close is an event on the job (`ShellOpened`, `ShellClosed`, who and why). An
interactive job (spec `interactive`) ends with its last session: when a session closes and no
other of the job is open or asked for, the job ends with reason `SessionEnded` (one that
persists only when the session's command exited, not when it was idle or its user went away):
Succeeded when the command exited 0, Failed when it exited otherwise or the session failed,
Cancelled when it ended by policy (idle) or its user went away.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from scheduler import notify
from scheduler.agent.wire import TERMINAL_COMMAND_BYTES, TerminalOrder, terminal_size
from scheduler.jobs.events import record
from scheduler.lifecycle.transitions import terminate_job
from scheduler.models import Job, Node, ShellSession, Task
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import JobRequest, JobState, TaskState

REORDER_SECONDS = 10.0  # a session asked for but not opened is ordered again after this
UNANSWERED_SECONDS = 30.0  # ... and given up after this (its agent did not open it)
MAX_SESSIONS_PER_JOB = 8  # open or asked for at once


class ShellRefused(Exception):
    """Why this user cannot open a session in this job (said to them as is)."""


def may_open(job: Job, user: Any) -> bool:
    """The job's owner; staff too where the job's queue allows it (`staff_shell`)."""
    if job.owner_id == user.pk:
        return True
    return bool(user.is_staff and job.queue.staff_shell)


def shell_job(job_id: int, user: Any) -> Job | None:
    """The job `job_id` if `user` may open a terminal in it (else None: it is not theirs)."""
    job = Job.objects.select_related("queue").filter(pk=job_id).first()
    if job is None or not getattr(user, "is_authenticated", False) or not may_open(job, user):
        return None
    return job


def request_session(job: Job, user: Any, channel: str, command: str = "", rows: object = 24,
                    cols: object = 80, term: object = "") -> ShellSession:  # fmt: skip
    """Ask the agent of the job's first running task for a session relayed to the channel
    `channel` (ShellRefused when the job does not run, or has too many); wakes that agent's
    lease."""
    if len(command.encode()) > TERMINAL_COMMAND_BYTES:
        raise ShellRefused(f"command: at most {TERMINAL_COMMAND_BYTES} bytes")
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        if job.state != JobState.RUNNING or job.requested_action == JobRequest.CANCEL:
            raise ShellRefused(f"job {job.pk} is {job.state}: a terminal needs a running job")
        task = (
            Task.objects.filter(job=job, state=TaskState.RUNNING)
            .exclude(node=None)
            .order_by("group", "index")
            .first()
        )
        if task is None or task.node_id is None:
            raise ShellRefused(f"job {job.pk} has no running task yet")
        live = ShellSession.objects.filter(job=job).exclude(state=ShellSession.State.CLOSED)
        if live.count() >= MAX_SESSIONS_PER_JOB:
            raise ShellRefused(f"job {job.pk} has {MAX_SESSIONS_PER_JOB} sessions open already")
        session = ShellSession.objects.create(
            key=secrets.token_hex(24), job=job, task=task, attempt=task.attempt,
            node_id=task.node_id, user=user, client_channel=channel[:200], command=command,
            rows=terminal_size(rows, 24), cols=terminal_size(cols, 80),
            term=str(term or "xterm-256color")[:64],
        )  # fmt: skip
        notify.orders(nodes=[task.node_id])
    return session


def terminal_orders(node: Node, handling: object) -> list[dict[str, Any]]:
    """Sessions asked for in this node's tasks that its agent is not handling yet (`handling`:
    the ids its lease lists), each ordered at most once per REORDER_SECONDS; those asked for
    longer than UNANSWERED_SECONDS ago are given up."""
    waiting = list(
        ShellSession.objects.filter(node=node, state=ShellSession.State.REQUESTED)[:50]
    )  # one indexed query per lease, nearly always empty
    if not waiting:
        return []
    now = timezone.now()
    live = set(handling) if isinstance(handling, list) else set()
    orders = []
    for session in waiting:
        if session.created_at < now - timedelta(seconds=UNANSWERED_SECONDS):
            close_session(session.key, "NotOpened", "the node's agent did not open it")
        elif session.key not in live and (
            session.ordered_at is None
            or session.ordered_at < now - timedelta(seconds=REORDER_SECONDS)
        ):
            orders.append(session)
    ShellSession.objects.filter(pk__in=[s.pk for s in orders]).update(ordered_at=now)
    return [
        TerminalOrder(s.key, s.task_id, s.attempt, s.command, s.rows, s.cols, s.term).to_json()
        for s in orders
    ]


def claim(key: str, node: Node) -> ShellSession | None:
    """The agent of `node` opens session `key`: Requested -> Open (None if it is not this
    node's, or not waiting)."""
    with transaction.atomic():
        claimed = ShellSession.objects.filter(
            key=key, node=node, state=ShellSession.State.REQUESTED
        ).update(state=ShellSession.State.OPEN, opened_at=timezone.now())
        if not claimed:
            return None
        session = ShellSession.objects.select_related("job", "user", "job__queue").get(key=key)
        what = f": {session.command[:200]}" if session.command else ""
        who = f"by {session.user.username} on {node.name}{what}"
        record(EventKind.SHELL_OPENED, Reason.USER_REQUEST, who, job=session.job)
        notify.changed(jobs=[session.job_id])
    return session


def close_session(key: str, reason: str, message: str = "",
                  exit_status: int | None = None) -> bool:  # fmt: skip
    """Close the session (once: False if it was closed already), record why, and end an
    interactive job whose last session this was, unless it persists.

    Locks the session's row alone (then, to end the job, the job's, FOR NO KEY UPDATE): a
    report of the node's tasks, which locks them all, takes FOR KEY SHARE on the rows its
    events and usage records name (their owner, their job) when it commits; a close holding
    those rows FOR UPDATE while it waited for its task's row deadlocked with it (16 sessions
    ending at once, bench/shell_latency.py --end exit on PostgreSQL)."""
    with transaction.atomic():
        session = (
            ShellSession.objects.select_for_update(of=("self",))
            .select_related("job", "user")
            .filter(key=key)
            .exclude(state=ShellSession.State.CLOSED)
            .first()
        )
        if session is None:
            return False
        session.state, session.closed_at = ShellSession.State.CLOSED, timezone.now()
        session.reason, session.exit_status = reason[:200], exit_status
        session.save(update_fields=["state", "closed_at", "reason", "exit_status"])
        status = "" if exit_status is None else f", exit status {exit_status}"
        text = f"{reason}{status}" + (f": {message[:300]}" if message else "")
        record(EventKind.SHELL_CLOSED, reason[:50], f"{session.user.username}'s session: {text}",
               job=session.job)  # fmt: skip
        notify.changed(jobs=[session.job_id])
        _end_job_with_session(session, message)
    return True


def _end_job_with_session(session: ShellSession, message: str) -> None:
    """An interactive job ends with its last session: whatever the session's end when the job
    does not persist, only when its command exited when it does (an idle or dropped session
    leaves it to be attached again). Its state says how the session ended (`_job_end`)."""
    job = session.job
    interactive = job.spec.get("interactive") if isinstance(job.spec, dict) else None
    if not isinstance(interactive, dict):
        return
    if interactive.get("persist") and session.reason != "Exited":
        return
    others = ShellSession.objects.filter(job=job).exclude(state=ShellSession.State.CLOSED)
    if others.exclude(pk=session.pk).exists():
        return
    fresh = Job.objects.select_for_update(no_key=True).get(pk=job.pk)  # close_session: why
    if fresh.state not in (JobState.RUNNING, JobState.PENDING, JobState.SUSPENDED):
        return  # it ended, or is ending for another reason (a cancel, its walltime)
    final_state, said = _job_end(session, message)
    terminate_job(fresh, final_state=final_state, reason=Reason.SESSION_ENDED, message=said)


def _job_end(session: ShellSession, message: str) -> tuple[str, str]:
    """The state an interactive job ends in with its last session, and the message: the
    command's exit status decides as a batch job's would; a session ended by policy or by
    its user going away cancels the job; one that failed fails it."""
    said = f"its terminal session ended ({session.reason}"
    if session.reason == "Exited":
        status = session.exit_status
        final = JobState.SUCCEEDED if status == 0 else JobState.FAILED
        return final, f"{said}, the command's exit status {status})"
    final = JobState.CANCELLED if session.reason in ("Idle", "Disconnected") else JobState.FAILED
    return final, f"{said}: {message[:300]})" if message else f"{said})"


def idle_minutes(session: ShellSession) -> float:
    """The job's queue's idle limit for terminal sessions (0: none)."""
    return float(session.job.queue.interactive_idle_minutes)


def session_end(key: str) -> tuple[str, int | None] | None:
    """How session `key` ended (its reason and exit status), or None while it is not closed."""
    row = (ShellSession.objects.filter(key=key, state=ShellSession.State.CLOSED)
           .values_list("reason", "exit_status").first())  # fmt: skip
    return None if row is None else (row[0], row[1])


def mark_input(key: str) -> None:
    """Session `key` got input now (scheduler/lifecycle/idle_sessions.py reads it)."""
    ShellSession.objects.filter(key=key).update(last_input_at=timezone.now())
