"""EASY backfill: one reservation for the first job blocked by resources, and every later
job that can start now without delaying it."""

from __future__ import annotations

from scheduler.core.actions import Memo, guarded, in_order, place, simulate
from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.resources import Resources
from scheduler.core.session import Fits, NodeScan, Session
from scheduler.core.statement import Statement
from scheduler.core.status import Code, Status
from scheduler.core.types import NodeView, Reservation


def backfill(session: Session) -> None:
    """EASY backfill: the first job blocked by resources gets a reservation at the earliest
    time running tasks' walltimes free enough for its whole gang; a later job starts now only
    if it ends before that time or uses only what the reservation does not need."""
    # Free resources and the reservation's spare only shrink during backfill, so a shape
    # that failed stays failed: one memo for unconstrained jobs, one for those that must fit
    # around the reservation.
    free_memo, spare_memo = Memo(), Memo()
    delays: dict[object, bool] = {}
    blocked = session.blocked
    holder = blocked if blocked is not None and blocked.id not in session.pipelined else None
    if holder is not None:
        _reserve(session, holder)

    def skip(job: JobInfo) -> bool:
        if job.id in session.placed or job.id in session.pipelined or job is holder:
            return True
        failure = session.failures.get(job.id)
        return failure is not None and not failure.blocked_by_resources

    for job in in_order(session, skip=skip):

        def work(job: JobInfo = job) -> None:
            nonlocal holder
            reservation = session.reservation
            fits = _fits_around(session, job, reservation) if reservation else None
            failure = place(
                session, job, "backfill", free_memo if fits is None else spare_memo, fits
            )
            if failure is None:
                if reservation is not None and fits is not None:
                    _consume_spare(session, job, reservation)
                return
            session.failures[job.id] = failure
            if reservation is None and failure.blocked_by_resources:
                holder = job
                _reserve(session, job)
                return
            shape = Memo.key(session, job)
            if fits is not None and failure.blocked_by_resources:
                if shape is None or shape not in delays:
                    delays[shape] = place_ignoring_reservation(session, job)
                if delays[shape]:
                    assert reservation is not None
                    session.set_pending(
                        job,
                        Status(
                            Code.RESERVED_FOR_OTHER,
                            f"waiting for job {reservation.job.id} (reservation):"
                            " starting now would delay it",
                        ),
                    )
                    return
            session.set_pending(job, failure.status())

        guarded(session, job, work)


def place_ignoring_reservation(session: Session, job: JobInfo) -> bool:
    """Could the job start now if there were no reservation? (for its pending reason)"""
    statement = Statement(session)
    scan = NodeScan(session, job)
    placed = 0
    for task in session.pending_tasks(job):
        node = scan.find(task)
        if node is not None:
            statement.allocate(job, task, node)
            placed += 1
    statement.discard()
    return session.job_ready(job, placed)


def _fits_around(session: Session, job: JobInfo, reservation: Reservation) -> Fits | None:
    """The extra test a backfilled job's tasks must pass so the reservation is not delayed."""
    if not reservation.placed:
        return None  # the reserved job fits nowhere for now: nothing to protect
    if (
        reservation.start is not None
        and job.walltime is not None
        and session.now + job.walltime <= reservation.start
    ):
        return None  # it ends before the reservation starts
    planned: dict[str, Resources] = {}

    def fits(node: NodeView, task: TaskInfo) -> bool:
        spare = reservation.spare.get(node.name)
        if spare is None:
            return False
        used = planned.get(node.name, Resources()) + task.resources
        if not used.fits_in(spare):
            return False
        planned[node.name] = used
        return True

    return fits


def _consume_spare(session: Session, job: JobInfo, reservation: Reservation) -> None:
    """A backfilled job that runs past the reservation's start uses up spare where it runs."""
    tasks = {t.id: t for t in job.tasks}
    for bind in reversed(session.binds):
        if bind.job_id != job.id:
            break
        task = tasks[bind.task_id]
        if bind.node in reservation.spare:
            reservation.spare[bind.node] = reservation.spare[bind.node] - task.resources


def _reserve(session: Session, job: JobInfo) -> None:
    """Give the job the reservation: the earliest time its gang fits as running tasks end at
    their walltimes, and what it leaves spare on each node then."""
    start, spare, placed = _plan_reservation(session, job)
    session.reservation = Reservation(job, start, dict(spare), placed)
    failure = session.failures.get(job.id)
    counts = dict(failure.node_reasons) if failure is not None else {}
    if start is None:
        message = (
            "waiting for reservation: start unknown, the resources it needs are held by jobs"
            " without a walltime"
        )
        session.set_pending(job, Status(Code.RESERVED, message, counts))
    else:
        message = (
            f"waiting for reservation: expected to start in {start - session.now:.0f}s,"
            " when running jobs reach their walltime"
        )
        session.set_pending(job, Status(Code.RESERVED, message, counts, start))


def _plan_reservation(
    session: Session, job: JobInfo
) -> tuple[float | None, dict[str, Resources], bool]:
    """The reservation's start, spare and whether it places at all. The same as last time if
    nothing started or ended since, for the same job, and no walltime end has passed (the
    ends then are the same moments)."""
    key = (job.id, session.version, frozenset(session.nominated), frozenset(session.evicted))
    cached = session.reservations.get(key)
    if cached is not None and cached[0] >= session.now:
        return cached[1]
    room = {n.name: n.free() for n in session.nodes if n.ready and n.name not in session.nominated}
    ends = _ends(session, room)
    plan = _earliest(session, job, room, ends)
    first_end = min((t for t, _n, _r in ends), default=float("inf"))
    session.reservations = {key: (first_end, plan)} if first_end > session.now else {}
    return plan


def _ends(session: Session, room: dict[str, Resources]) -> list[tuple[float, str, Resources]]:
    """When each task on the nodes in `room` gives back what it holds, soonest first (not
    clamped to now: the caller does that)."""
    ends: list[tuple[float, str, Resources]] = []
    for node in session.nodes:
        if node.name not in room:
            continue
        for running, task in node.tasks:
            if task.state == "Releasing" or running.id in session.evicted:
                when = session.now
            elif running.walltime is not None and task.started_at is not None:
                when = task.started_at + running.walltime
            else:
                continue
            release = Resources(task.resources.cpu, task.resources.memory, len(task.devices))
            ends.append((when, node.name, release))
    return ends


def _earliest(
    session: Session,
    job: JobInfo,
    room: dict[str, Resources],
    ends: list[tuple[float, str, Resources]],
) -> tuple[float | None, dict[str, Resources], bool]:
    now = session.now
    ends = sorted(((max(now, t), name, r) for t, name, r in ends), key=lambda e: (e[0], e[1]))
    need = session.min_request(job)
    start: float | None = None
    placement: dict[str, Resources] | None = None
    cpu = memory = gpu = 0
    for free in room.values():
        cpu, memory, gpu = cpu + free.cpu, memory + free.memory, gpu + free.gpu
    i = 0
    while i < len(ends):
        moment = ends[i][0]
        while i < len(ends) and ends[i][0] == moment:
            _, name, release = ends[i]
            room[name] = room[name] + release
            cpu, memory, gpu = cpu + release.cpu, memory + release.memory, gpu + release.gpu
            i += 1
        if need.cpu > cpu or need.memory > memory or need.gpu > gpu:
            continue
        placement = simulate(session, job, room)
        if placement is not None:
            start = moment
            break
    if placement is None:
        # Some of what it needs is held by jobs without a walltime: the start is unknown,
        # but the nodes it would take once everything ends are still kept for it.
        for node in session.nodes:
            if node.name in room:
                for running, task in node.tasks:
                    if not _has_end(session, running, task):
                        room[node.name] = room[node.name] + Resources(
                            task.resources.cpu, task.resources.memory, len(task.devices)
                        )
        placement = simulate(session, job, room)
    spare: dict[str, Resources] = {}
    if placement is not None:
        spare = dict(room)
        for name, used in placement.items():
            spare[name] = room[name] - used
    return start, spare, placement is not None


def _has_end(session: Session, running: JobInfo, task: TaskInfo) -> bool:
    return (
        task.state == "Releasing"
        or running.id in session.evicted
        or (running.walltime is not None and task.started_at is not None)
    )
