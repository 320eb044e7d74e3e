"""Extending a running job's walltime (`berth extend`, POST /api/v1/jobs/<id>/extend/,
docs/interactive.md#time-limits-and-extending).

Allowed up to the queue's `max_walltime`, and only when no waiting job's reservation would
start later for it. That is decided with the scheduler's own plan (scheduler/core/plan.py):
the cluster is planned as the next cycle would see it twice, with the job's walltime as it
is and as extended, and every waiting job's estimated start is compared. The extended job is
planned to run to its full walltime in both (not to a runtime prediction), so a job that
would start after it is protected even if it outlives its prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.db import transaction

from scheduler import notify
from scheduler.core.cycle import run_cycle
from scheduler.core.model import SchedulingPolicy, Snapshot
from scheduler.core.plan import plan_starts
from scheduler.cycle import fairshare
from scheduler.cycle.planning import plan_depth
from scheduler.cycle.snapshot import load_snapshot
from scheduler.jobs.events import record
from scheduler.models import Job
from scheduler.states.codes import EventKind, Reason
from scheduler.states.names import JobState

# An estimate later by less than this is the clock's drift between two plans, not a delay.
DELAY_TOLERANCE_SECONDS = 1.0


class ExtendRefused(Exception):
    """Why a walltime cannot be extended (a 409 for the person who asked)."""


@dataclass(frozen=True)
class Delay:
    """The first waiting job (in plan order) whose estimated start the extension delays."""

    job_id: int
    before: float
    after: float | None  # None: it could no longer be planned at all


def extend_walltime(job: Job, seconds: int, user: object) -> Job:
    """Add `seconds` to running `job`'s walltime, or ExtendRefused saying why not."""
    walltime = _checked(job, seconds)
    delay = delayed_reservation(job.pk, walltime + seconds)
    if delay is not None:
        later = "could no longer be planned" if delay.after is None else (
            f"would start {delay.after - delay.before:.0f} s later")  # fmt: skip
        raise ExtendRefused(
            f"extending job {job.pk} by {seconds} s would delay the reservation of job "
            f"{delay.job_id}, which waits for its resources: it {later}"
        )
    with transaction.atomic():
        fresh = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        if fresh.walltime != walltime or fresh.state != JobState.RUNNING:
            raise ExtendRefused(f"job {job.pk} changed meanwhile; try again")
        fresh.walltime = walltime + seconds
        fresh.spec = {**fresh.spec, "walltime": fresh.walltime}
        fresh.save(update_fields=["walltime", "spec"])
        by = getattr(user, "username", "")
        record(EventKind.WALLTIME_EXTENDED, Reason.EXTENDED,
               f"by {seconds} s to {fresh.walltime} s (by {by})", job=fresh)  # fmt: skip
        notify.changed(jobs=[fresh.pk])
    return fresh


def _checked(job: Job, seconds: int) -> int:
    """The job's walltime now, if it may grow by `seconds` at all; else ExtendRefused."""
    if job.state != JobState.RUNNING:
        raise ExtendRefused(f"job {job.pk} is {job.state}: only a running job is extended")
    if job.walltime is None:
        raise ExtendRefused(f"job {job.pk} has no walltime: there is nothing to extend")
    most = job.queue.max_walltime
    if most is not None and job.walltime + seconds > most:
        room = max(0, most - job.walltime)
        raise ExtendRefused(
            f'queue "{job.queue.name}" allows a walltime of at most {most} s (max_walltime);'
            f" job {job.pk} has {job.walltime} s, so it may grow by at most {room} s"
        )
    return job.walltime


def delayed_reservation(job_id: int, walltime: int) -> Delay | None:
    """Plan the cluster with job `job_id` ending at its walltime now and at `walltime`; the
    first waiting job whose estimated start is later in the second plan, or None."""
    loaded = load_snapshot()
    config = fairshare.scheduling_policy()
    fairshare.fill(loaded.snapshot, config)
    now_plan = _full_walltime(loaded.snapshot, job_id, None)
    then_plan = _full_walltime(loaded.snapshot, job_id, walltime)
    before = _starts(now_plan, config)
    after = _starts(then_plan, config)
    for waiting, start in before.items():
        if start is None or waiting == job_id:
            continue
        later = after.get(waiting)
        if later is None or later > start + DELAY_TOLERANCE_SECONDS:
            return Delay(waiting, start, later)
    return None


def _full_walltime(snapshot: Snapshot, job_id: int, walltime: int | None) -> Snapshot:
    """`snapshot` with job `job_id` planned to its full walltime (`walltime` if given)."""
    jobs = [
        replace(j, predicted=None, walltime=j.walltime if walltime is None else float(walltime))
        if j.id == job_id
        else j
        for j in snapshot.jobs
    ]
    return replace(snapshot, jobs=jobs)


def _starts(snapshot: Snapshot, config: SchedulingPolicy) -> dict[int, float | None]:
    """When each job not yet running starts: now for those the next cycle would place (by
    backfill too), then every waiting job's estimate in plan order. A job placed now
    without the extension but not with it is delayed too."""
    result = run_cycle(snapshot, config)  # leaves the snapshot as it was
    starts: dict[int, float | None] = {b.job_id: snapshot.now for b in result.binds}
    for job_id, start in plan_starts(snapshot, result, config, depth=plan_depth()).starts.items():
        starts.setdefault(job_id, start)
    return starts
