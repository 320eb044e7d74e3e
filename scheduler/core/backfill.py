"""EASY backfill: one reservation for the first job blocked by resources, and every later
job that can start now without delaying it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.core import predict, sharing
from scheduler.core.actions import (
    Memo,
    _GangRoom,
    in_order,
    place,
    quick_refusal,
    record_fault,
    simulate,
    total_refusal,
)
from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.resources import Resources, tuple_new
from scheduler.core.session import Fits, NodeScan, Session, first_taker
from scheduler.core.statement import Statement, commit_one
from scheduler.core.status import Code, Status
from scheduler.core.types import Failure, NodeView, Reservation, Spare


def backfill(session: Session) -> None:
    """EASY backfill: the first job blocked by resources gets a reservation at the earliest
    time running tasks' walltimes free enough for its whole gang; a later job starts now only
    if it ends before that time or uses only what the reservation does not need.

    A session that does not explain failures plans the reservation only when a job might
    start next to it (it must be planned before anything else starts: that is the state it
    is planned in); one that explains plans it at once, for the holder's estimated start."""
    run = _Backfill(session)
    for job in in_order(session, skip_ids=run.skipped):
        try:  # `guarded`, without a closure per job
            run.one(job)
        except Exception as exc:  # noqa: BLE001 - fault isolation is the point
            record_fault(session, job, exc)
    if run.deferred is not None and run.deferred.id not in session.reservation_starts:
        run.planned()  # the holder's first reservation: when it was promised to start


class _Backfill:
    """One backfill pass: its memos, the reservation's holder, and a plan not made yet."""

    def __init__(self, session: Session) -> None:
        self.session = session
        # Free resources and the reservation's spare only shrink during backfill, so a
        # shape that failed stays failed: one memo for unconstrained jobs, one for those
        # that must fit around the reservation.
        self.free_memo, self.spare_memo = Memo(), Memo()
        self.delays: dict[object, bool] = {}
        blocked = session.blocked
        self.holder = (
            blocked if blocked is not None and blocked.id not in session.pipelined else None
        )
        self.deferred: JobInfo | None = None
        # While the plan is deferred nothing is placed: a job's quick refusal then depends
        # only on its shape, queue and gang size (as plugins' `overused` may only depend on
        # the queue and the job's request) and on what is free and allocated (`state`). It
        # is kept per job with its status (`session.kept_refusals`) and per (shape, queue,
        # gang size) (`session.quick_refusals`) with the state it was made in, and used
        # again while the state is the same, in this pass or a later one.
        self.state: tuple[object, ...] = ()
        # The status of each refusal, made once: jobs refused alike share it (statuses are
        # never changed once set). By id: a refusal stays in `session.failures` all cycle.
        self.statuses: dict[int, Status] = {}
        # `_keep_refusal`'s; `tried`: how many jobs `one` went the long way for (`_Refused`).
        self.alike_refused: dict[tuple[int, bool], _Refused] = {}
        self.tried, self.by_tries = 0, session.refusals_by_tries
        # Queue -> whether what was bound since may decide a refusal in it (`_version`).
        self.binds_matter: dict[str, bool] = {}
        # The jobs the pass skips: placed, pipelined, the holder, or refused for good before
        # it. Worked out when the pass starts: what the pass changes is only ever the job it
        # serves (`in_order` asks as each job comes up, so asking first skips the same jobs).
        self.skipped = {
            *session.placed,
            *session.pipelined,
            *(i for i, failure in session.failures.items() if not failure.blocked_by_resources),
        }
        if self.holder is not None:
            self.skipped.add(self.holder.id)
            self._defer(self.holder)
        # Whether a job that needs its one pending task may be started by `_start_single`
        # (what `_single_task` asks of the session, and `overused` says None of every job
        # of a queue without a capability or per-user limits): asked once per pass.
        self.single = (
            session.single_in_backfill
            and session.single_at_once
            and not session.placing_predicates
            and session.static_node_order
            and session.limits_only_overuse
        )
        # id(shape) -> (the shape, the first task of it `_start_single` saw).
        self.stand_ins: dict[int, tuple[Any, TaskInfo]] = {}

    def _defer(self, holder: JobInfo) -> None:
        session = self.session
        self.deferred = _hold(session, holder)
        self.state = (
            session.ready_free_cpu,
            session.ready_free_memory,
            *(queue.allocated for queue in session.queues.values()),
        )

    def planned(self) -> Reservation | None:
        if self.deferred is not None:
            self.tried += 1  # (a new reservation)
            _reserve(self.session, self.deferred)
            self.deferred = None
        return self.session.reservation

    def one(self, job: JobInfo) -> None:
        session = self.session
        if self.deferred is not None:
            # Most jobs end here, refused as in the last pass: without a call.
            kept = session.kept_refusals.get(job.id)
            if kept is not None and kept[0] == self.state:
                session.failures[job.id] = kept[1]
                session.pending[job.id] = kept[2]
                return
            if self._refused_quickly(job):
                return
            reservation = self.planned()
        else:
            reservation = session.reservation  # `planned`, with nothing deferred
        # Must it fit around the reservation? Not if that places nothing, nor if it ends
        # before its start (`predict.runtime`, spelled out: once per job that waits).
        around = False
        if reservation is not None and reservation.placed:
            start, ran, predicted = reservation.start, job.walltime, job.predicted
            if predicted is not None and ran is not None:
                ran = min(predicted, ran)
            around = not (start is not None and ran is not None and session.now + ran <= start)
        key = None  # (the refusal of the last alike job, `_keep_refusal`, spelled out)
        if (  # (`job.is_candidate`, spelled out)
            session.alike_refusals
            and job.state in ("Pending", "Suspended")
            and not job.suspend_requested
        ):
            # (Its gang size, `needed`, is in its key: enqueue made the keys, in snapshot
            # order, `prefill_alike_keys`; a job without one has none to be refused by.)
            key = session.alike_key(job)
            if key is not None and key[2] > 0:
                refused = self.alike_refused.get((id(key), not around))
                if refused is not None and refused.key is key:
                    # It stands if no job went the long way since it was last known to.
                    if refused.known_at != self.tried:
                        if (
                            refused.reservation is not reservation
                            or refused.entry is not refused.memo.get(refused.memo_key)
                            # (None: binds never matter in its queue, `_version`)
                            or (refused.version is not None and refused.version != session.version)
                        ):
                            refused = None
                        elif self.by_tries:
                            refused.known_at = self.tried
                    if refused is not None:
                        session.failures[job.id] = refused.failure
                        session.pending[job.id] = refused.status
                        return
        self._long_way(job, reservation, around, key)

    def _long_way(
        self,
        job: JobInfo,
        reservation: Reservation | None,
        around: bool,
        key: tuple[Any, ...] | None,
    ) -> None:
        """`one` for a job not refused as one before it: start it, or say why it waits (and
        keep that for the next alike job). `around`: whether it must fit around the
        reservation; `key`: its alike key, if refusing alike jobs together may use it."""
        self.tried += 1
        # The extra test its tasks must pass so the reservation is not delayed.
        fits = _AroundReservation(reservation.spare) if around and reservation else None
        if key is not None and key[2] == 1 and self._start_single(job, key, reservation, fits):
            return  # (placed: no refusal to keep)
        self._try(job, reservation, fits, key)
        if key is not None and key[2] > 0 and job.id not in self.session.placed:
            self._keep_refusal(job, key, (id(key), not around), reservation)

    def _try(
        self,
        job: JobInfo,
        reservation: Reservation | None,
        fits: Fits | None,
        key: tuple[Any, ...] | None = None,
    ) -> None:
        """Place the job now (around the reservation, if it must), or say why it waits
        (`key`: its alike key, if `one` has it: its shape and gang size for `place`)."""
        session = self.session
        if fits is not None and not session.explain_failures and session.gang_decides:
            assert reservation is not None  # (`total_refusal` says None otherwise)
            if self._refused(job, _refusal_by_spare(session, job, reservation)):
                return
        memo = self.free_memo if fits is None else self.spare_memo
        if key is None:
            failure = place(session, job, "backfill", memo, fits)
        else:
            failure = place(session, job, "backfill", memo, fits, key[2], key[0])
        if failure is None:
            if reservation is not None and fits is not None:
                _consume_spare(session, job, reservation)
            elif _ends_before(session, job, reservation):
                # It takes room only until the reservation's start: the plan stands.
                session.plan_harmless.add(job.id)
                session.carry_plan()
            return
        session.failures[job.id] = failure
        if reservation is None and failure.blocked_by_resources:
            self.holder = job
            self._defer(job)
            return
        _explain_wait(session, job, failure, fits, reservation, self.delays)

    def _start_single(
        self,
        job: JobInfo,
        key: tuple[Any, ...],
        reservation: Reservation | None,
        fits: _AroundReservation | None,
    ) -> bool:
        """`_try` for a job whose alike key says it needs one task (`key`), spelled out
        as one call: start it as `place` would through `_place_single` (the same node,
        devices and changes) and take its spare as `_consume_spare` would; False, having
        changed nothing, where any step of that way might go otherwise (`_single_of`, or
        no node takes it): `_try` then decides."""
        task = self._single_of(job, key, fits)
        if task is None:
            return False
        request = key[0][0]  # (the task's resources: equal values)
        node = self._taker(key[0], task, fits)
        if node is None:
            return False
        session = self.session
        commit_one(session, job, task, node, "backfill", request)
        if fits is not None:
            assert reservation is not None
            # `_consume_spare` for the one task just bound.
            reservation.spare.take(node.name, request)
            if task.gpu_mig:
                reservation.spare.take_instance(node.name, task.gpu_mig)
        elif _ends_before(session, job, reservation):
            session.plan_harmless.add(job.id)
            session.carry_plan()
        return True

    def _single_of(
        self, job: JobInfo, key: tuple[Any, ...], fits: _AroundReservation | None
    ) -> TaskInfo | None:
        """The job's one pending task, if `place` would go straight to `_place_single`
        with it (`_single_task`) and `_try` refuse it nowhere before: the queue has no
        capability and no per-user limits (`overused` then says None of every job in it),
        no fraction or MIG instance, no refusal by totals or the memo."""
        session = self.session
        shape, name = key[0], key[1]
        if not self.single or shape[2] or name in session.user_limited:
            return None
        if session.queues[name].info.capability is not None:
            return None
        cpu, memory, gpu = shape[0]
        if not gpu and not session.explain_failures and session.gang_decides:
            # `total_refusal` might refuse it (`_refusal_by_spare`, `_refusal_by_total`).
            if cpu > session.ready_free_cpu or memory > session.ready_free_memory:
                return None
            if fits is not None:
                spare = fits.spare.total
                if cpu > spare.cpu or memory > spare.memory:
                    return None
        memo = self.free_memo if fits is None else self.spare_memo
        known = memo.max_placeable.get((shape, name))
        if known is not None and known[0] < 1:
            return None  # (`place` refuses it from the memo)
        tasks = session.pending_tasks(job)
        return tasks[0] if len(tasks) == 1 else None

    def _taker(
        self, shape: tuple[Any, ...], task: TaskInfo, fits: _AroundReservation | None
    ) -> NodeView | None:
        """`_place_single`'s node order, spelled out, and `first_taker`. The order is asked
        for the first task of this shape the pass saw: a static order (`_single_task`)
        depends only on the task's selector, resources and fraction, which the shape holds
        (equal values), and this job's own task, wherever it lies in memory, is touched
        once (to bind it), not also its selector and request."""
        session = self.session
        seen = self.stand_ins.get(id(shape))
        if seen is None or seen[0] is not shape:
            seen = self.stand_ins[id(shape)] = (shape, task)
        stand_in = seen[1]
        cpu, memory, gpu = shape[0]
        if session.max_devices == 0:
            order: Iterable[NodeView] = session.ordered_nodes(stand_in)
        elif gpu:
            order = session.candidate_nodes(stand_in)
        else:
            order = session.walk_once(stand_in)
        if fits is None:
            return first_taker(order, shape[0], session.nominated, None)
        one = fits.one
        return first_taker(
            order, shape[0], session.nominated, lambda node: one(node.name, cpu, memory, gpu)
        )

    # --- alike jobs refused together ------------------------------------------------------
    #
    # A job alike another (`Session.alike_key`: the same shape of pending tasks, queue, gang
    # size and, where per-user limits apply, owner) that either must fit around the
    # reservation or need not, as the other, is refused as the other was when nothing that
    # decides it changed since: the same reservation, the same memo entry for its shape in
    # the memo it is tried with (`place` refuses it from there, with the same failure), and
    # where its refusal may also depend on what was bound since (a queue with a capability
    # or per-user limits, other plugins' `overused`, or totals checked without explaining:
    # `total_refusal`), nothing bound. Its status is the same too (`_explain_wait` decides
    # once per shape). Only jobs waiting to start (not a running job's extra tasks).

    def _version(self, queue: str) -> int | None:
        """The session's version where binds may decide a refusal in `queue`, else None
        (whether they may is the same all pass: asked once per queue)."""
        session = self.session
        binds_matter = self.binds_matter.get(queue)
        if binds_matter is None:
            binds_matter = self.binds_matter[queue] = (
                not session.explain_failures
                or queue in session.user_limited
                or session.queues[queue].info.capability is not None
            )
        return session.version if binds_matter else None

    def _keep_refusal(
        self,
        job: JobInfo,
        key: tuple[Any, ...],
        alike: tuple[int, bool],
        reservation: Reservation | None,
    ) -> None:
        """Keep how the job (of alike key `key`, kept under `alike`) was refused for the
        next alike job, if it left the reservation as it was (it did not become its
        holder)."""
        session = self.session
        if self.deferred is not None or session.reservation is not reservation:
            return
        failure, status = session.failures.get(job.id), session.pending.get(job.id)
        if failure is not None and status is not None:
            shape, queue, _need, _owner = key
            memo = self.free_memo if alike[1] else self.spare_memo
            refused = _Refused(key, failure, status, reservation)
            refused.depends_on(memo.max_placeable, (shape, queue), self._version(queue))
            refused.known_at = self.tried if self.by_tries else -1
            self.alike_refused[alike] = refused

    def _refused_quickly(self, job: JobInfo) -> bool:
        """Refuse the job without trying nodes, if that is how it fails; keep why."""
        session = self.session
        refusal = self._quick_refusal(job)
        if refusal is None:
            return False
        status = self.statuses.get(id(refusal)) or self._status(refusal)
        session.kept_refusals[job.id] = (self.state, refusal, status)
        session.failures[job.id] = refusal
        session.set_pending(job, status)
        return True

    def _quick_refusal(self, job: JobInfo) -> Failure | None:
        session = self.session
        key = session.alike_key(job)
        if key is None:
            return quick_refusal(session, job)
        kept = session.quick_refusals.get(key)
        if kept is not None and kept[0] == self.state:
            return kept[1]
        refusal = quick_refusal(session, job)
        if refusal is not None:
            session.quick_refusals[key] = (self.state, refusal)
        return refusal

    def _refused(self, job: JobInfo, refusal: Failure | None) -> bool:
        if refusal is None:
            return False
        self.session.failures[job.id] = refusal
        status = self.statuses.get(id(refusal))
        self.session.set_pending(job, status or self._status(refusal))
        return True

    def _status(self, refusal: Failure) -> Status:
        status = self.statuses[id(refusal)] = self.session.status_of(refusal)
        return status


def _refusal_by_spare(session: Session, job: JobInfo, reservation: Reservation) -> Failure | None:
    """The failure `place` would return for a job that must fit in the reservation's spare,
    when its gang needs more cpu or memory than all of the spare (only where `place` itself
    would skip the attempt: alike tasks without devices, failures not explained)."""
    spare = reservation.spare.total
    return total_refusal(session, job, spare.cpu, spare.memory)


def _hold(session: Session, job: JobInfo) -> JobInfo | None:
    """Make the job the reservation's holder; plan it now, or return it to plan later."""
    if session.explain_failures:
        _reserve(session, job)
        return None
    session.reservation = None
    session.set_pending(job, Status(Code.RESERVED, "holds the reservation"))
    return job


def _explain_wait(
    session: Session,
    job: JobInfo,
    failure: Failure,
    fits: Fits | None,
    reservation: Reservation | None,
    delays: dict[object, bool],
) -> None:
    """Why a job that could not be backfilled waits: for the reservation, if it could start
    without it, else its own failure."""
    shape = Memo.key(session, job)
    if not session.explain_failures and _without_devices(session, job):
        # Trying it without the reservation changes nothing but this status: skipped when
        # failures are not explained (with devices it moves nodes in the index: kept).
        session.set_pending(job, session.status_of(failure))
        return
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


def _without_devices(session: Session, job: JobInfo) -> bool:
    shape = session.shape(job)
    if shape is not None:
        return shape[0].gpu == 0 and not shape[2]  # (a MIG instance has no whole device)
    return all(
        task.resources.gpu == 0 and not task.gpu_share for task in session.pending_tasks(job)
    )


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


def _ends_before(session: Session, job: JobInfo, reservation: Reservation | None) -> bool:
    return (
        reservation is not None
        and reservation.placed
        and reservation.start is not None
        and (ran := predict.runtime(job)) is not None
        and session.now + ran <= reservation.start
    )


class _Refused:
    """How a job waiting to start was refused (`failure`, `status`), kept for the next
    alike job (of alike `key`), with what decided it: the `reservation`, the entry of its
    shape (`memo_key`) in the memo it was tried with (`memo`: its `max_placeable`), the
    session's version where binds may decide it (`_Backfill._version`), and the
    `_Backfill.tried` it was last known to hold at (-1: never, with the shortcut off).

    `_Backfill.alike_refused` keeps it by (the id of its key, whether it need not fit
    around the reservation): one object per distinct key (`Session._interned_one`), whose
    hash, that of nested tuples, is then not worked out per job; it holds the key, so an
    id is only ever its own. `tried` counts the jobs `one` went the long way for (tried to
    place, or planned for): until the next, the reservation, the memos and the session's
    version stay as they are, and so does every kept refusal known to hold."""

    __slots__ = (
        "key", "failure", "status", "reservation", "memo", "memo_key", "entry", "version",
        "known_at",
    )  # fmt: skip

    def __init__(
        self,
        key: tuple[Any, ...],
        failure: Failure,
        status: Status,
        reservation: Reservation | None,
    ) -> None:
        self.key, self.failure, self.status = key, failure, status
        self.reservation = reservation
        self.known_at = -1

    def depends_on(
        self, memo: dict[tuple[object, ...], tuple[int, Failure]], key: tuple[object, ...],
        version: int | None,
    ) -> None:  # fmt: skip
        """Its shape's entry (`key`) in `memo` as it is now, and `version`, decide it."""
        self.memo, self.memo_key, self.version = memo, key, version
        self.entry = memo.get(key)


class _AroundReservation:
    """A backfilled job's tasks must fit in the reservation's spare on their nodes, beside
    what its earlier tasks took of it (`Fits`, and `many` for a run of alike tasks)."""

    __slots__ = ("spare", "planned", "instances")

    def __init__(self, spare: Spare) -> None:
        self.spare = spare
        self.planned: dict[str, Resources] = {}  # node -> what the job's tasks took there
        self.instances: dict[tuple[str, str], int] = {}  # (node, profile) -> taken so far

    def __call__(self, node: NodeView, task: TaskInfo) -> bool:
        profile = task.gpu_mig
        left = self.spare.instances_left(node.name, profile) if profile else None
        if left is None:  # (no MIG instance, or one of a profile the reservation needs not)
            return self.many(node, task.resources, 1) == 1
        key = (node.name, profile)
        taken = self.instances.get(key, 0)
        if taken >= left or self.many(node, task.resources, 1) != 1:
            return False
        self.instances[key] = taken + 1
        return True

    def one(self, name: str, cpu: int, memory: int, gpu: int) -> bool:
        """`__call__` for a job's first task, asking (`cpu`, `memory`, `gpu`) and no MIG
        instance, on node `name`: `many` for one task, taking nothing (the job's one task
        is committed at once and `_consume_spare` takes its spare)."""
        room = self.spare.get(name)
        if room is None:
            return False
        used = self.planned.get(name)
        if used is not None:
            room = room - used
        return room.cpu >= cpu and room.memory >= memory and room.gpu >= gpu

    def many(self, node: NodeView, request: Resources, count: int) -> int:
        """How many (at most `count`) more tasks asking `request` fit in the node's spare,
        taken as one by one would: each fits if it and those before it do."""
        spare = self.spare.get(node.name)
        if spare is None:
            return 0
        used = self.planned.get(node.name)
        room = spare if used is None else spare - used
        cpu, memory, gpu = request
        # Each dimension: as many as its room holds, or none if it is over already.
        if cpu:
            count = min(count, room.cpu // cpu)
        elif room.cpu < 0:
            return 0
        if memory:
            count = min(count, room.memory // memory)
        elif room.memory < 0:
            return 0
        if gpu:
            count = min(count, room.gpu // gpu)
        elif room.gpu < 0:
            return 0
        if count <= 0:
            return 0
        taken = tuple_new(Resources, (cpu * count, memory * count, gpu * count))
        self.planned[node.name] = taken if used is None else used + taken
        return count


def _consume_spare(session: Session, job: JobInfo, reservation: Reservation) -> None:
    """A backfilled job that runs past the reservation's start uses up spare where it runs."""
    for bound_job, task, node, _devices in reversed(session.bound):
        if bound_job is not job:
            break
        reservation.spare.take(node.name, task.resources)
        if task.gpu_mig:
            reservation.spare.take_instance(node.name, task.gpu_mig)


def _reserve(session: Session, job: JobInfo) -> None:
    """Give the job the reservation: the earliest time its gang fits as running tasks end at
    their walltimes, and what it leaves spare on each node then."""
    start, spare, placed = _plan_reservation(session, job)
    session.reservation = Reservation(job, start, spare.copy(), placed)
    if start is not None:
        session.reservation_starts.setdefault(job.id, start)
    failure = session.failures.get(job.id)
    counts = dict(failure.node_reasons) if failure is not None else {}
    if start is None:
        message = (
            "waiting for reservation: start unknown, the resources it needs are held by jobs"
            " without a walltime"
        )
        session.set_pending(job, Status(Code.RESERVED, message, counts))
    else:
        predicted = any(running.predicted is not None for running in session.running)
        message = (
            f"waiting for reservation: expected to start in {start - session.now:.0f}s,"
            f" when running jobs reach their {'predicted end' if predicted else 'walltime'}"
        )
        session.set_pending(job, Status(Code.RESERVED, message, counts, start))


def _plan_reservation(session: Session, job: JobInfo) -> tuple[float | None, Spare, bool]:
    """The reservation's start, spare and whether it places at all. The same as last time if
    nothing started or ended since, for the same job, and no walltime end has passed (the
    ends then are the same moments)."""
    key = (job.id, session.version, frozenset(session.nominated), frozenset(session.evicted))
    cached = session.reservations.get(key)
    if cached is not None:
        first_end, plan, since = cached
        if since is None and first_end >= session.now:
            return plan  # nothing changed since, no walltime end passed
        if (
            since is not None
            and session.now < plan[0]
            and (since <= session.now or _fits_nowhere_before(session, job, since))
        ):
            # Since it was made, the room changed only before `since` (not at its start):
            # where that is over, or the gang fits at no moment before it, it stands.
            return plan
    free = session.free_on_ready_nodes()
    if session.nominated:
        room = {k: v for k, v in free.items() if k not in session.nominated}
    else:
        room = dict(free)
    ends: list[tuple[Any, ...]]
    if session.releasing or session.evicted:
        ends = sorted(_ends(session, room), key=lambda e: (e[0], e[1]))
    else:
        ends = session.walltime_ends  # (end, node, ..., resources), sorted by end
    plan = _earliest(session, job, room, ends)
    first_end = ends[0][0] if ends else float("inf")
    session.reservations = {key: (first_end, plan, None)} if first_end > session.now else {}
    session.plan_harmless = set()  # what was backfilled before it is in its room
    return plan


def _fits_nowhere_before(session: Session, job: JobInfo, until: float) -> bool:
    """Do the totals alone say the job's gang fits at no moment from now until `until`?
    (They only grow as walltime ends pass: the last moment before `until` decides.)"""
    if not session.all_ready or session.nominated or session.releasing or session.evicted:
        return False
    need = session.min_request(job)
    devices = session.min_devices(job)
    cpu, memory = session.ready_free_cpu, session.ready_free_memory
    gpu = session.ready_free_gpu
    for entry in session.walltime_ends:
        if entry[0] >= until:
            break
        release = entry[-1]
        cpu, memory, gpu = cpu + release.cpu, memory + release.memory, gpu + release.gpu
    return need.cpu > cpu or need.memory > memory or devices > gpu


def _ends(session: Session, room: dict[str, Resources]) -> list[tuple[float, str, Resources]]:
    """When each task on the nodes in `room` gives back what it holds (not clamped to now:
    the caller does that)."""
    ends: list[tuple[float, str, Resources]] = []
    for node in session.nodes:
        if node.name not in room:
            continue
        for running, task in node.tasks:
            gpu = session.device_release(task)
            if task.state == "Releasing" or running.id in session.evicted:
                when = session.now
                if task.gpu_share and running.id in session.evicted:
                    # Evicted this cycle: the device's other occupants may run on (the
                    # releasers were chosen before). A Releasing one gives the device back
                    # only if it leaves last (`Session.leaves_at`).
                    gpu = 0
            elif running.walltime is not None and task.started_at is not None:
                correction = session.config.prediction_correction
                when = predict.end(running, task.started_at, session.now, correction) or 0.0
            else:
                continue
            release = Resources(task.resources.cpu, task.resources.memory, gpu)
            ends.append((when, node.name, release))
    return ends


def _earliest(
    session: Session,
    job: JobInfo,
    room: dict[str, Resources],
    ends: list[tuple[Any, ...]],
) -> tuple[float | None, Spare, bool]:
    """`ends` (end, node, ..., what it gives back) sorted by end: taken in that order,
    clamped to now, moment by moment (the order within a moment does not matter, all of it
    is added before the gang is tried). Totals first: the rooms per node are only brought
    up to date when the totals say the gang may fit."""
    cpu, memory, gpu = _room_totals(session, room)
    if session.nominated or not session.all_ready:
        ends = [e for e in ends if e[1] in room]
    request = session.min_request(job)
    # (Its fractions packed onto devices, as `simulate` places them.)
    need = Resources(request.cpu, request.memory, session.min_devices(job))
    instances = _Instances.of(session, job, room)  # (None: it asks no MIG instance)
    applied = 0  # ends added to `room` so far
    # For a gang of one run of alike tasks, how many of them each node's room holds, kept
    # as ends are added: first fit places it exactly when the sum is enough (`_GangRoom`),
    # so `simulate` (a walk over every eligible node) is asked only then.
    gang: _GangRoom | None = None
    counted = False
    count, i, now = len(ends), 0, session.now
    while i < count:
        moment = max(now, ends[i][0])
        while i < count and ends[i][0] <= moment:
            release = ends[i][-1]
            cpu, memory, gpu = cpu + release.cpu, memory + release.memory, gpu + release.gpu
            i += 1
        if need.cpu > cpu or need.memory > memory or need.gpu > gpu:
            continue
        _release_into(room, ends[applied:i])
        if not counted:
            gang, counted = _GangRoom.of(session, job, room), True
        elif gang is not None:
            for entry in ends[applied:i]:
                gang.changed(entry[1], room[entry[1]])
        applied = i
        if gang is not None and not gang.enough():
            continue
        left = None if instances is None else instances.at(moment)
        placement = simulate(session, job, room, left)
        if placement is not None:
            # The room then is what the totals counted; the gang takes `need` of it.
            spare = Spare(room, placement, Resources(cpu, memory, gpu) - need, left)
            return moment, spare, True
    _release_into(room, ends[applied:])
    return _unknown_start(session, job, room, instances)


def _room_totals(session: Session, room: dict[str, Resources]) -> tuple[int, int, int]:
    """The cpu, memory and devices free now in `room` (all ready nodes, unless some are
    nominated for a preempting job)."""
    if not session.nominated:
        return session.ready_free_cpu, session.ready_free_memory, session.ready_free_gpu
    cpu = memory = gpu = 0
    for free in room.values():
        cpu, memory, gpu = cpu + free.cpu, memory + free.memory, gpu + free.gpu
    return cpu, memory, gpu


def _release_into(room: dict[str, Resources], ends: list[tuple[Any, ...]]) -> None:
    for entry in ends:
        name, release = entry[1], entry[-1]
        free = room[name]  # `+` spelled out: this runs for every end of every plan
        room[name] = tuple_new(
            Resources,
            (free.cpu + release.cpu, free.memory + release.memory, free.gpu + release.gpu),
        )


def _unknown_start(
    session: Session, job: JobInfo, room: dict[str, Resources], instances: _Instances | None
) -> tuple[float | None, Spare, bool]:
    """Some of what it needs is held by jobs without a walltime: the start is unknown, but
    the nodes it would take once everything ends are still kept for it (and the instances
    of its MIG profiles there)."""
    for node in session.nodes:
        if node.name in room:
            for running, task in node.tasks:
                if not _has_end(session, running, task):
                    room[node.name] = room[node.name] + Resources(
                        task.resources.cpu, task.resources.memory, session.device_release(task)
                    )
    left = None if instances is None else instances.at(None)
    placement = simulate(session, job, room, left)
    total = Resources()
    for free in room.values():
        total = total + free
    for used in (placement or {}).values():
        total = total - used
    return None, Spare(room, placement or {}, total, left), placement is not None


class _Instances:
    """The MIG instances of the profiles a gang asks, per node of the room, over time: free
    now, and given back as their occupants leave (`sharing.instance_releases`, as start
    estimates count them): at their ends, now if being released, suspended or evicted."""

    __slots__ = ("free", "ends")

    def __init__(self) -> None:
        self.free: dict[tuple[str, str], int] = {}
        self.ends: dict[tuple[str, str], list[float | None]] = {}

    @classmethod
    def of(cls, session: Session, job: JobInfo, room: dict[str, Resources]) -> _Instances | None:
        profiles = {task.gpu_mig for task, _count in session.gang_runs(job) if task.gpu_mig}
        if not profiles:
            return None
        evicted = session.evicted

        def end(running: JobInfo, task: TaskInfo) -> float | None:
            return session.now if running.id in evicted else session.leaves_at(running, task)

        found = cls()
        for node in session.nodes:
            if node.name not in room:
                continue
            for profile in profiles & node.mig_profiles:
                key = (node.name, profile)
                found.free[key], found.ends[key] = sharing.instance_releases(node, profile, end)
        return found

    def at(self, moment: float | None) -> dict[tuple[str, str], int]:
        """How many are free at `moment` (None: once every occupant has left)."""
        counts = {}
        for key, free in self.free.items():
            ends = self.ends[key]
            if moment is None:
                counts[key] = free + len(ends)
            else:
                counts[key] = free + sum(1 for end in ends if end is not None and end <= moment)
        return counts


def _has_end(session: Session, running: JobInfo, task: TaskInfo) -> bool:
    return (
        task.state == "Releasing"
        or running.id in session.evicted
        or (running.walltime is not None and task.started_at is not None)
    )
