"""The actions of a cycle, in order: enqueue, allocate, preempt, reclaim, backfill.

Every loop over jobs isolates each job: a job that fails its predicates, does not fit, or
whose plugin raises is skipped with its reason recorded, and every later job is still
considered in the same cycle (Volcano's backfill stopped at the first bad job).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.plugins import job_request
from scheduler.core.resources import Resources
from scheduler.core.session import Evict, Failure, NodeState, Session, Statement
from scheduler.core.status import Code, Status

log = logging.getLogger("berth.core")

Fits = Callable[[NodeState, TaskInfo], bool]


def _guarded(session: Session, job: JobInfo, work: Callable[[], None]) -> None:
    """Run one job's work; an exception marks that job and the loop goes on."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - fault isolation is the point
        log.exception("scheduling job %s failed", job.id)
        session.stats["errors"] += 1
        session.set_pending(job, Status(Code.SCHEDULER_ERROR, f"{type(exc).__name__}: {exc}"))
        session.failures[job.id] = Failure(Code.SCHEDULER_ERROR, str(exc), False)


# --- enqueue -----------------------------------------------------------------------------


def enqueue(session: Session) -> None:
    """Admit candidate jobs whose queue exists, is open and could ever hold them."""
    for job in sorted(session.candidates, key=session.job_key):

        def admit(job: JobInfo = job) -> None:
            problem = session.job_valid(job)
            if problem is not None:
                session.set_pending(job, problem)
                session.failures[job.id] = Failure(problem.code, problem.message, False)
                return
            if not session.pending_tasks(job):
                return
            session.queues[job.queue].jobs.append(job)

        _guarded(session, job, admit)


def _in_order(session: Session, skip: Callable[[JobInfo], bool]) -> Iterator[JobInfo]:
    """Admitted jobs, queue by queue in fair-share order, jobs by priority then age. The
    queue to serve next is chosen after every job, as placements change the shares."""
    cursors = {}
    heap = []
    for name, queue in session.queues.items():
        jobs = [j for j in queue.jobs if not skip(j)]
        if jobs:
            cursors[name] = iter(jobs)
            heap.append((session.queue_key(queue), name))
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        job = next(cursors[name], None)
        if job is None:
            continue
        yield job
        heapq.heappush(heap, (session.queue_key(session.queues[name]), name))


# --- placing one job ---------------------------------------------------------------------


class _Memo:
    """Shapes that did not fit, valid while free resources only shrink (within an action).

    A shape is (task resources, node selector, queue) of a job whose pending tasks are all
    alike; the memo keeps how many such tasks could be placed at most, so a later job of the
    same shape that needs more is refused with the same explanation without a scan. Plugin
    predicates must depend on the task and node only (not on the job's identity) for this to
    hold, as the default ones do.
    """

    def __init__(self) -> None:
        self.max_placeable: dict[tuple[object, ...], tuple[int, Failure]] = {}
        self.ever_fits: dict[tuple[object, ...], bool] = {}

    @staticmethod
    def shape(job: JobInfo, tasks: list[TaskInfo]) -> tuple[object, ...] | None:
        if not tasks:
            return None
        first = tasks[0]
        key = (first.resources, tuple(sorted(first.node_selector.items())), job.queue)
        if any(
            t.resources != first.resources or t.node_selector != first.node_selector for t in tasks
        ):
            return None
        return key


def place(
    session: Session, job: JobInfo, action: str, memo: _Memo, fits: Fits | None = None
) -> Failure | None:
    """Place the job's tasks all or nothing: the gang's `needed` tasks at once, the rest best
    effort within the queue's capability, in one statement."""
    tasks = session.pending_tasks(job)
    need = session.needed(job)
    queue = session.queues[job.queue]
    over = session.overused(queue, job)
    if over is not None:
        return Failure(over.code, over.message, False)
    shape = _Memo.shape(job, tasks)
    if shape is not None and shape in memo.max_placeable:
        most, failure = memo.max_placeable[shape]
        if need > most:
            return _failure(
                session,
                job,
                failure.detail,
                failure.blocked_by_resources,
                most,
                memo,
                failure.node_reasons,
            )
    cap = queue.info.capability
    room = cap - queue.allocated if cap is not None else None
    statement = Statement(session)
    placed = 0
    first_miss: TaskInfo | None = None
    for task in tasks:
        if first_miss is not None and _same_shape(task, first_miss):
            continue  # resources only shrink: the same shape cannot fit now either
        if placed >= need and room is not None and not task.resources.fits_in(room):
            continue  # a task beyond the gang never takes the queue past its capability
        node = session.find_node(job, task, fits)
        if node is None:
            first_miss = first_miss or task
            continue
        statement.allocate(job, task, node)
        if room is not None:
            room = room - task.resources
        placed += 1
    if placed and (first_miss is None or session.job_ready(job, placed)):
        statement.commit(action)
        return None
    if first_miss is None:
        statement.discard()
        message = f'queue "{queue.info.name}" at capability'
        return Failure(Code.QUEUE_QUOTA, message, False, placed)
    # Explain while the gang's own placements still stand: that is the state it failed in.
    detail, could_fit, counts = session.explain(job, first_miss)
    statement.discard()
    if need == 0:
        # A running job's extra tasks: they never hold up other jobs.
        code = Code.WAITING_FOR_RESOURCES if could_fit else Code.NEVER_FITS
        return Failure(code, detail, False, 0, detail, counts)
    failure = _failure(session, job, detail, could_fit, placed, memo, counts)
    if shape is not None:
        memo.max_placeable[shape] = (placed, failure)
    return failure


def _same_shape(a: TaskInfo, b: TaskInfo) -> bool:
    return a.resources == b.resources and a.node_selector == b.node_selector


def _failure(
    session: Session,
    job: JobInfo,
    detail: str,
    could_fit: bool,
    placed: int,
    memo: _Memo,
    counts: dict[str, int],
) -> Failure:
    need = session.needed(job)
    if placed == 0 and need <= 1:
        code = Code.WAITING_FOR_RESOURCES if could_fit else Code.NEVER_FITS
        return Failure(code, detail, could_fit, placed, detail, counts)
    if could_fit:
        key = (_Memo.shape(job, session.pending_tasks(job)), need)
        ever = memo.ever_fits.get(key) if key[0] is not None else None
        if ever is None:
            ever = _gang_could_ever_fit(session, job)
            if key[0] is not None:
                memo.ever_fits[key] = ever
        could_fit = ever
    return Failure(
        Code.GANG_INCOMPLETE if could_fit else Code.NEVER_FITS,
        f"gang: {placed}/{need} tasks placeable; {detail}",
        could_fit,
        placed,
        detail,
        counts,
    )


def _gang_could_ever_fit(session: Session, job: JobInfo) -> bool:
    """Would the gang fit on an empty cluster? If not, no amount of waiting helps."""
    room = {n.name: n.capacity() for n in session.nodes if n.ready}
    return _simulate(session, job, room) is not None


def _simulate(
    session: Session, job: JobInfo, room: dict[str, Resources]
) -> dict[str, Resources] | None:
    """First-fit the job's gang (its `needed` pending tasks) into `room`; usage per node."""
    room = dict(room)
    used: dict[str, Resources] = {}
    for task in session.pending_tasks(job)[: session.needed(job)]:
        for node in session.nodes:
            free = room.get(node.name)
            if free is None or not task.resources.fits_in(free):
                continue
            if session._node_reason(job, task, node) is not None:
                continue
            room[node.name] = free - task.resources
            used[node.name] = used.get(node.name, Resources()) + task.resources
            break
        else:
            return None
    return used


# --- allocate ----------------------------------------------------------------------------


def allocate(session: Session) -> None:
    """Start jobs in order. With strict order, stop at the first job blocked by resources:
    the jobs after it may only start through backfill, which protects its reservation."""
    memo = _Memo()
    for job in _in_order(session, skip=lambda j: j.id in session.failures):
        if session.blocked is not None and session.config.strict_order:
            break

        def work(job: JobInfo = job) -> None:
            failure = place(session, job, "allocate", memo)
            if failure is None:
                return
            session.failures[job.id] = failure
            session.set_pending(job, failure.status())
            if failure.blocked_by_resources and session.blocked is None:
                session.blocked = job

        _guarded(session, job, work)
    if session.blocked is not None and session.config.strict_order:
        for job in _in_order(
            session, skip=lambda j: j.id in session.failures or j.id in session.placed
        ):
            session.set_pending(
                job,
                Status(Code.PRIORITY, f"waiting for job {session.blocked.id} (first in order)"),
            )


# --- preempt and reclaim -----------------------------------------------------------------


def preempt(session: Session) -> None:
    """Within a queue, a higher-priority job that cannot start evicts the cheapest set of
    lower-priority preemptible jobs it needs; it then waits for them to release."""
    _evict_for(session, "Preempted", session.preemptable)


def reclaim(session: Session) -> None:
    """Across queues: a queue below its weighted share takes back resources from
    reclaimable queues above theirs."""
    _evict_for(session, "Reclaimed", session.reclaimable)


MAX_EVICTION_ATTEMPTS = 100


def _evict_for(
    session: Session,
    reason: str,
    select: Callable[[JobInfo, list[JobInfo]], list[JobInfo]],
) -> None:
    waiting = [
        session.jobs[i]
        for i, f in session.failures.items()
        if f.blocked_by_resources and i not in session.pipelined and i not in session.placed
    ]
    waiting.sort(key=session.job_key)
    for job in waiting[:MAX_EVICTION_ATTEMPTS]:

        def work(job: JobInfo = job) -> None:
            _evict_one(session, job, reason, select)

        _guarded(session, job, work)


def _future_room(session: Session) -> dict[str, Resources]:
    """What each ready node will have once the tasks being released are gone."""
    room = {}
    for node in session.nodes:
        if node.ready and node.name not in session.nominated:
            room[node.name] = node.free() + node.releasing()
    return room


def _evict_one(
    session: Session,
    job: JobInfo,
    reason: str,
    select: Callable[[JobInfo, list[JobInfo]], list[JobInfo]],
) -> None:
    room = _future_room(session)
    placement = _simulate(session, job, room)
    if placement is not None:
        _pipeline(session, job, placement, [])
        return
    victims = select(job, [j for j in session.running if j.id not in session.evicted])
    if not victims:
        return
    victims.sort(key=lambda v: (v.priority, _size(v), -(_start(v))))
    chosen: list[JobInfo] = []
    for victim in victims:
        chosen.append(victim)
        _free_into(room, victim, +1)
        placement = _simulate(session, job, room)
        if placement is not None:
            break
    if placement is None:
        return
    # Keep only the victims the placement really needs, cheapest set first.
    for victim in list(reversed(chosen[:-1])):
        _free_into(room, victim, -1)
        trial = _simulate(session, job, room)
        if trial is None:
            _free_into(room, victim, +1)
        else:
            chosen.remove(victim)
            placement = trial
    for victim in chosen:
        session.evicted.add(victim.id)
        message = f"{reason.lower()} by job {job.id} ({job.name}, priority {job.priority})"
        session.evictions.append(Evict(victim.id, reason, job.id, message))
        for task in victim.tasks:
            node = session.node_by_name.get(task.node or "")
            if node is not None and task.state in ("Assigned", "Running"):
                node.rel_cpu += task.resources.cpu
                node.rel_memory += task.resources.memory
                node.rel_devices += len(task.devices)
        queue = session.queues.get(victim.queue)
        if queue is not None:
            queue.allocated = queue.allocated - job_request(
                victim, [t for t in victim.tasks if t.state in ("Assigned", "Running")]
            )
    _pipeline(session, job, placement, chosen)


def _pipeline(
    session: Session, job: JobInfo, placement: dict[str, Resources], victims: list[JobInfo]
) -> None:
    session.pipelined[job.id] = sorted(placement)
    session.nominated.update(placement)
    waiting_on = ", ".join(str(v.id) for v in victims)
    message = "waiting for preempted jobs to release resources" + (
        f" (jobs {waiting_on})" if waiting_on else ""
    )
    session.set_pending(job, Status(Code.PREEMPTING, message))


def _free_into(room: dict[str, Resources], victim: JobInfo, sign: int) -> None:
    for task in victim.tasks:
        if task.node in room and task.state in ("Assigned", "Running"):
            delta = Resources(task.resources.cpu, task.resources.memory, len(task.devices))
            room[task.node] = room[task.node] + delta if sign > 0 else room[task.node] - delta


def _size(job: JobInfo) -> tuple[int, int, int]:
    held = job_request(job, [t for t in job.tasks if t.state in ("Assigned", "Running")])
    return (held.gpu, held.cpu, held.memory)


def _start(job: JobInfo) -> float:
    return max((t.started_at or 0.0 for t in job.tasks), default=0.0)


# --- backfill ----------------------------------------------------------------------------


@dataclass
class Reservation:
    job: JobInfo
    start: float | None  # None: resources held by jobs without walltime, start unknown
    spare: dict[str, Resources]  # per node: what the reserved job will not need at `start`
    placed: bool = True  # False: it fits nowhere even once everything ends (nominated nodes)


def backfill(session: Session) -> None:
    """EASY backfill: the first job blocked by resources gets a reservation at the earliest
    time running tasks' walltimes free enough for its whole gang; a later job starts now only
    if it ends before that time or uses only what the reservation does not need."""
    # Free resources and the reservation's spare only shrink during backfill, so a shape
    # that failed stays failed: one memo for unconstrained jobs, one for those that must fit
    # around the reservation.
    free_memo, spare_memo = _Memo(), _Memo()
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

    for job in _in_order(session, skip=skip):

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
            shape = _Memo.shape(job, session.pending_tasks(job))
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

        _guarded(session, job, work)


def place_ignoring_reservation(session: Session, job: JobInfo) -> bool:
    """Could the job start now if there were no reservation? (for its pending reason)"""
    statement = Statement(session)
    placed = 0
    for task in session.pending_tasks(job):
        node = session.find_node(job, task)
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

    def fits(node: NodeState, task: TaskInfo) -> bool:
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
    """Find when the job's gang fits as running tasks end at their walltimes."""
    room = {n.name: n.free() for n in session.nodes if n.ready and n.name not in session.nominated}
    ends: list[tuple[float, str, Resources]] = []
    for node in session.nodes:
        if node.name not in room:
            continue
        for running, task in node.tasks:
            release = Resources(task.resources.cpu, task.resources.memory, len(task.devices))
            if task.state == "Releasing" or running.id in session.evicted:
                ends.append((session.now, node.name, release))
            elif running.walltime is not None and task.started_at is not None:
                ends.append(
                    (max(session.now, task.started_at + running.walltime), node.name, release)
                )
    ends.sort(key=lambda e: (e[0], e[1]))
    need = job_request(job, session.pending_tasks(job)[: session.needed(job)])
    start: float | None = None
    placement: dict[str, Resources] | None = None
    total = Resources()
    for free in room.values():
        total = total + free
    i = 0
    while i < len(ends):
        moment = ends[i][0]
        while i < len(ends) and ends[i][0] == moment:
            _, name, release = ends[i]
            room[name] = room[name] + release
            total = total + release
            i += 1
        if not need.fits_in(total):
            continue
        placement = _simulate(session, job, room)
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
        placement = _simulate(session, job, room)
    spare = {}
    if placement is not None:
        spare = {name: free - placement.get(name, Resources()) for name, free in room.items()}
    session.reservation = Reservation(job, start, spare, placement is not None)
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


def _has_end(session: Session, running: JobInfo, task: TaskInfo) -> bool:
    return (
        task.state == "Releasing"
        or running.id in session.evicted
        or (running.walltime is not None and task.started_at is not None)
    )


ACTIONS: dict[str, Callable[[Session], None]] = {
    "enqueue": enqueue,
    "allocate": allocate,
    "preempt": preempt,
    "reclaim": reclaim,
    "backfill": backfill,
}
