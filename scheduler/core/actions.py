"""The actions of a cycle, in order: enqueue, allocate, preempt, reclaim, backfill (the last
in `scheduler.core.backfill`), and placing one job, which allocate and backfill share.

Every loop over jobs isolates each job: a job that fails its predicates, does not fit, or
whose plugin raises is skipped with its reason recorded, and every later job is still
considered in the same cycle (Volcano's backfill stopped at the first bad job).
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from itertools import compress, filterfalse, repeat
from operator import attrgetter, not_

from scheduler.core import sharing
from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.resources import Resources, tuple_new
from scheduler.core.session import (
    Fits,
    NodeScan,
    Session,
    Shape,
    alike,
    first_taker,
    whole_devices,
)
from scheduler.core.statement import Statement, commit_one
from scheduler.core.status import Code, Status
from scheduler.core.types import Failure, NodeView

log = logging.getLogger("berth.core")


def guarded(session: Session, job: JobInfo, work: Callable[[], None]) -> None:
    """Run one job's work; an exception marks that job and the loop goes on."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - fault isolation is the point
        record_fault(session, job, exc)


def record_fault(session: Session, job: JobInfo, exc: Exception) -> None:
    """Mark the job whose work raised `exc` (called in the `except` block: it logs the
    traceback)."""
    log.exception("scheduling job %s failed", job.id)
    session.stats["errors"] += 1
    session.set_pending(job, Status(Code.SCHEDULER_ERROR, f"{type(exc).__name__}: {exc}"))
    session.failures[job.id] = Failure(Code.SCHEDULER_ERROR, str(exc), False)


# --- enqueue -----------------------------------------------------------------------------


def enqueue(session: Session) -> None:
    """Admit candidate jobs whose queue exists, is open and could ever hold them. A standing
    session admits each job once, when it arrives (`StandingSession.submit`): here it only
    records again why the jobs it could not admit wait."""
    if session.standing:
        for job_id, problem in session.refused.items():
            session.set_pending(session.jobs[job_id], problem)
            session.failures[job_id] = Failure(problem.code, problem.message, False)
        return
    valid, queues = session.job_valid, session.queues
    valid_queues = _valid_queues(session)
    jobs = session.candidates
    order = session.key_order(jobs)
    # Whether each has a pending task, asked in snapshot order (where the jobs and their
    # tasks lie in memory one after the other), read by position in key order.
    waiting = session.have_pending(jobs)
    queue_of = list(map(_queue, jobs))  # (likewise)
    names = set(queue_of)
    if names <= valid_queues:  # every job admitted, none asked: each into its queue
        _admit(session, jobs, queue_of, compress(order, map(waiting.__getitem__, order)), names)
    else:
        for i in order:
            job = jobs[i]
            try:  # `guarded`, without a closure per job
                invalid = None if queue_of[i] in valid_queues else valid(job)
                if invalid is None:
                    if waiting[i]:
                        queues[job.queue].jobs.append(job)
                    continue
                session.set_pending(job, invalid)
                session.failures[job.id] = Failure(invalid.code, invalid.message, False)
            except Exception as exc:  # noqa: BLE001 - fault isolation is the point
                record_fault(session, job, exc)
    if session.alike_refusals:
        session.prefill_alike_keys(session.candidates)


def _admit(
    session: Session, jobs: list[JobInfo], queue_of: list[str], at: Iterable[int], names: set[str]
) -> None:
    """The `jobs` at positions `at` (in key order) into their queues (`queue_of` names
    each job's; `names` all of them), in that order: enqueue's loop where no job is asked
    `job_valid`, without a test per job (nothing in it can fail) nor a look at the job."""
    if len(names) == 1:
        session.queues[next(iter(names))].jobs.extend(map(jobs.__getitem__, at))
        return
    into = {name: session.queues[name].jobs.append for name in names}
    for i in at:
        into[queue_of[i]](jobs[i])


def _valid_queues(session: Session) -> set[str]:
    """The queues whose every job `job_valid` would say None of, without asking: open
    queues without a capability, where every plugin says so (`valid_in_open_queue`)."""
    if not session.open_queues_valid:
        return set()
    return {
        name
        for name, queue in session.queues.items()
        if queue.info.open and queue.info.capability is None
    }


def in_order(
    session: Session,
    skip: Callable[[JobInfo], bool] | None = None,
    skip_ids: Container[int] | None = None,
) -> Iterator[JobInfo]:
    """Admitted jobs, queue by queue in fair-share order, jobs by priority then age. The
    queue to serve next is chosen after every job, as placements change the shares.

    `skip` is asked as each job comes up, and so is `skip_ids` (jobs whose ids are in it are
    skipped; asked without a Python call per job): the callers' skips change only for the
    job that was just yielded, so asking late skips the same jobs as asking first."""

    def cursor(jobs: list[JobInfo]) -> Iterator[JobInfo]:
        kept: Iterator[JobInfo] = iter(jobs)
        if skip_ids is not None:
            # (`compress` takes each job and whether to keep it together, as it comes up.)
            kept = compress(jobs, map(not_, map(skip_ids.__contains__, map(_job_id, jobs))))
        return kept if skip is None else filterfalse(skip, kept)

    busy = [name for name, queue in session.queues.items() if queue.jobs]
    if len(busy) == 1:
        # One queue with work: the order is its own; no shares to compare.
        return cursor(session.queues[busy[0]].jobs)
    return _across_queues(session, {name: cursor(session.queues[name].jobs) for name in busy})


_job_id = attrgetter("id")
_queue = attrgetter("queue")


def in_order_unchanged(session: Session, skip_ids: Container[int]) -> Iterator[JobInfo]:
    """`in_order` for a caller that changes no queue while it walks the jobs: each queue's
    key then stays as it was, so the queues are served one after the other, least key
    first, each to its end (as `_across_queues` serves a queue whose state is the same)."""
    busy = [queue for queue in session.queues.values() if queue.jobs]
    busy.sort(key=session.queue_key)  # (keys end with the queue's name: no two are equal)
    for queue in busy:
        jobs = queue.jobs
        yield from compress(jobs, map(not_, map(skip_ids.__contains__, map(_job_id, jobs))))


def _across_queues(session: Session, cursors: dict[str, Iterator[JobInfo]]) -> Iterator[JobInfo]:
    """A queue's key depends on its own state, of which only what it holds changes while
    its jobs are served: it is worked out again only when that changed."""
    keys: dict[str, tuple[Resources, int, tuple[object, ...]]] = {}

    def key(name: str) -> tuple[object, ...]:
        queue = session.queues[name]
        known = keys.get(name)
        if known is None or known[0] != queue.allocated or known[1] != queue.shared_gpu:
            known = keys[name] = (queue.allocated, queue.shared_gpu, session.queue_key(queue))
        return known[2]

    heap = [(key(name), name) for name in cursors]
    heapq.heapify(heap)
    while heap:
        served, name = heapq.heappop(heap)
        cursor, queue = cursors[name], session.queues[name]
        for job in cursor:
            yield job
            known = keys[name]
            if known[0] is queue.allocated and known[1] == queue.shared_gpu:
                continue  # it holds the very same as when its key was made (most jobs wait)
            now = key(name)
            if now != served:
                heapq.heappush(heap, (now, name))
                break
            # Its key is as it was, the least of all (keys end with the queue's name, so
            # no two are equal; the others did not change): it is served again.


# --- placing one job ---------------------------------------------------------------------


class Memo:
    """Shapes that did not fit, valid while free resources only shrink (within an action).

    A shape is (task resources, node selector, queue) of a job whose pending tasks are all
    alike; the memo keeps how many such tasks could be placed at most, so a later job of the
    same shape that needs more is refused with the same explanation without a scan. Plugin
    predicates must depend on the task and node only (not on the job's identity) for this to
    hold, as the default ones do.
    """

    def __init__(self) -> None:
        self.max_placeable: dict[tuple[object, ...], tuple[int, Failure]] = {}

    @staticmethod
    def key(session: Session, job: JobInfo) -> tuple[object, ...] | None:
        shape = session.shape(job)
        return None if shape is None else (shape, job.queue)


def place(
    session: Session, job: JobInfo, action: str, memo: Memo, fits: Fits | None = None,
    need: int | None = None, shape: Shape | None = None,
) -> Failure | None:  # fmt: skip
    """Place the job's tasks all or nothing: the gang's `needed` tasks at once, the rest best
    effort within the queue's capability, in one statement. A caller that has the job's
    `needed` and `shape` at hand passes them (both, or neither)."""
    if need is None:
        need = session.need.get(job.id)  # `needed`
        if need is None:
            need = job.min_available
        shape = session.shape(job)
    queue = session.queues[job.queue]
    over = session.overused(queue, job)
    if over is not None:
        return Failure(over.code, over.message, False)
    key = None if shape is None else (shape, job.queue)  # `Memo.key`
    known = memo.max_placeable.get(key) if key is not None else None
    if known is not None:
        most, failure = known
        if need > most:
            return _failure(
                session, job, failure.detail, failure.blocked_by_resources, most,
                failure.node_reasons,
            )  # fmt: skip
    if not session.explain_failures and session.gang_decides:  # (else it says None)
        refusal = _refusal_by_total(session, job)
        if refusal is not None:
            return refusal
    tried = _start_job(session, job, action, fits, need, shape)
    if tried is None:
        return None
    statement, placed, first_miss = tried
    if first_miss is None:
        statement.discard()
        message = f'queue "{queue.info.name}" at capability'
        return Failure(Code.QUEUE_QUOTA, message, False)
    # Explain while the gang's own placements still stand: that is the state it failed in.
    detail, could_fit, counts = session.explain(job, first_miss)
    statement.discard()
    if need == 0:
        # A running job's extra tasks: they never hold up other jobs.
        code = Code.WAITING_FOR_RESOURCES if could_fit else Code.NEVER_FITS
        return Failure(code, detail, False, detail, counts)
    failure = _failure(session, job, detail, could_fit, placed, counts)
    if key is not None:
        memo.max_placeable[key] = (placed, failure)
    return failure


def quick_refusal(session: Session, job: JobInfo) -> Failure | None:
    """The failure `place` would return without trying any node, if it is that simple:
    the queue is at its capability, or the gang needs more than all ready nodes have free."""
    over = session.overused(session.queues[job.queue], job)
    if over is not None:
        return Failure(over.code, over.message, False)
    return _refusal_by_total(session, job)


def _refusal_by_total(session: Session, job: JobInfo) -> Failure | None:
    return total_refusal(session, job, session.ready_free_cpu, session.ready_free_memory)


def total_refusal(session: Session, job: JobInfo, cpu: int, memory: int) -> Failure | None:
    """The failure of a job whose gang of alike tasks without devices needs more than `cpu`
    or `memory` in total, if it is one and failures are not explained."""
    if session.explain_failures or not session.gang_decides:
        return None  # (`_cannot_fit_in` would say so)
    need = session.needed(job)
    if not _cannot_fit_in(session, job, need, cpu, memory):
        return None
    # Nothing in it depends on what is free: the same for every job of this shape and need.
    key = (session.shape(job), need)
    refusal = session.refusals.get(key)
    if refusal is None:
        first = session.pending_tasks(job)[0]
        could_fit = bool(session.eligible_nodes(job, first))
        refusal = session.refusals[key] = _failure(session, job, "", could_fit, 0, {})
        session.refusal_statuses[id(refusal)] = refusal.status()
    return refusal


def _cannot_fit_in(session: Session, job: JobInfo, need: int, cpu: int, memory: int) -> bool:
    """True if the gang's alike cpu-only tasks need more cpu or memory than there is (on all
    ready nodes, or in all of the reservation's spare): the attempt would fail, so it is
    skipped. Only when failures are not
    explained (the explanation describes the attempt), and only for tasks without devices
    (an attempt on devices moves nodes in the index, which later placements see)."""
    if session.explain_failures or need <= 0 or not session.gang_decides:
        return False
    shape = session.shape(job)
    if shape is None or shape[0].gpu:
        return False
    request = shape[0]
    return request.cpu * need > cpu or request.memory * need > memory


def _start_job(
    session: Session, job: JobInfo, action: str, fits: Fits | None, need: int, shape: Shape | None
) -> tuple[Statement, int, TaskInfo | None] | None:
    """Start the job (None: its tasks are placed and committed), or say how far it got: the
    statement of what it placed, how many, and the first task that did not fit."""
    single = _single_task(session, job, need, shape)
    if single is not None:
        # (`_allocate_tasks` for one task: it starts if it is placed, else nothing changed.)
        if _place_single(session, job, single, action, fits):
            return None
        return Statement(session), 0, single
    statement = Statement(session)
    placed, first_miss = _allocate_tasks(session, job, statement, fits, shape)
    if placed and (first_miss is None or session.job_ready(job, placed)):
        statement.commit(action)
        return None
    return statement, placed, first_miss


def _single_task(session: Session, job: JobInfo, need: int, shape: Shape | None) -> TaskInfo | None:
    """The one pending task of a job that needs just it, if `_place_single` may place it:
    whole devices or none (no fraction, no MIG instance), no queue capability, no predicate
    asked when placing, a node order that depends on free devices alone."""
    if (
        need != 1
        or shape is None
        or shape[2]
        or session.queues[job.queue].info.capability is not None
        or not session.single_at_once
        or session.placing_predicates
        or not session.static_node_order
    ):
        return None
    tasks = session.pending_tasks(job)
    return tasks[0] if len(tasks) == 1 else None


def _place_single(
    session: Session, job: JobInfo, task: TaskInfo, action: str, fits: Fits | None
) -> bool:
    """Place and commit a job's one task (`_single_task`) on the first node that takes it,
    as `_allocate_tasks` would (a task with devices as `NodeScan.find` finds its node, one
    without as `_allocate_alike` does); False, changing nothing, if no node takes it."""
    cpu, memory, gpu = task.resources
    if gpu:
        static = session.max_devices == 0  # (`NodeScan.find`: the order is static)
        order = session.ordered_nodes(task) if static else session.candidate_nodes(task)
    else:
        order = session.ordered_nodes(task) if session.max_devices == 0 else session.walk_once(task)
    # A test of the node alone, if the caller's `fits` has one (`one`: as `fits` for a
    # job's first task).
    one = getattr(fits, "one", None)
    accept: Callable[[NodeView], bool] | None = None
    if one is not None:
        accept = lambda node: one(node.name, cpu, memory, gpu)  # noqa: E731
    elif fits is not None:
        accept = lambda node: fits(node, task)  # noqa: E731
    taker = first_taker(order, task.resources, session.nominated, accept)
    if taker is None:
        return False
    commit_one(session, job, task, taker, action)
    return True


def _allocate_tasks(
    session: Session, job: JobInfo, statement: Statement, fits: Fits | None, shape: Shape | None
) -> tuple[int, TaskInfo | None]:
    """Allocate what fits of the job's pending tasks (of `shape`, if all alike); how many,
    and the first that did not."""
    cap = session.queues[job.queue].info.capability
    if cap is None and _alike_at_once(session, shape):
        return _allocate_alike(session, job, statement, fits)
    need = session.needed(job)
    room = cap - session.queues[job.queue].allocated if cap is not None else None
    scan = NodeScan(session, job, fits)
    placed = 0
    first_miss: TaskInfo | None = None
    for task in session.pending_tasks(job):
        if first_miss is not None and _same_shape(task, first_miss):
            continue  # resources only shrink: the same shape cannot fit now either
        if placed >= need and room is not None and not task.resources.fits_in(room):
            continue  # a task beyond the gang never takes the queue past its capability
        node = scan.find(task)
        if node is None:
            first_miss = first_miss or task
            continue
        statement.allocate(job, task, node)
        if room is not None:
            room = room - task.resources
        placed += 1
    return placed, first_miss


def _alike_at_once(session: Session, shape: Shape | None) -> bool:
    """May a job's pending tasks, of `shape` if all alike, be placed in one scan
    (`_allocate_alike`)? When they are all alike and without devices, the node order is
    static and no predicate is asked when placing: placing one then changes only what is
    free on its node."""
    if not session.alike_at_once or session.placing_predicates or not session.static_node_order:
        return False
    return shape is not None and shape[0].gpu == 0 and not shape[2]  # (no MIG instance)


def _allocate_alike(
    session: Session, job: JobInfo, statement: Statement, fits: Fits | None
) -> tuple[int, TaskInfo | None]:
    """`_allocate_tasks` for a job whose pending tasks are alike and without devices (and
    no queue capability): one scan in the node order, each node given as many of the tasks
    as it takes before the next, which is where placing them one by one puts them (a scan
    resumes at the node the last task took, and nothing before it can take the next). Tasks
    stop at the first that no node takes: the same shape fits nowhere after it either."""
    tasks = session.pending_tasks(job)
    first = tasks[0]
    cpu, memory = first.resources.cpu, first.resources.memory
    order = session.ordered_nodes(first) if session.max_devices == 0 else session.walk_once(first)
    nominated = session.nominated
    many = getattr(fits, "many", None)  # how many alike tasks fit, if it can tell at once
    count, placed = len(tasks), 0
    taking: list[tuple[NodeView, int]] = []  # (node, how many), allocated after the scan
    for node in order:
        if node.free_cpu < cpu or node.free_memory < memory or node.name in nominated:
            continue
        take = count - placed
        if cpu and node.free_cpu // cpu < take:
            take = node.free_cpu // cpu
        if memory and node.free_memory // memory < take:
            take = node.free_memory // memory
        if many is not None:
            take = many(node, first.resources, take)
        elif fits is not None:
            taken = 0
            while taken < take and fits(node, tasks[placed + taken]):
                taken += 1
            take = taken
        if take:
            taking.append((node, take))
            placed += take
            if placed == count:
                break
    # (The scan looks at each node once: taking from one earlier changes nothing later.)
    statement.allocate_alike(job, tasks, taking)
    return placed, tasks[placed] if placed < count else None


def _same_shape(a: TaskInfo, b: TaskInfo) -> bool:
    return alike(a, b)


def _failure(
    session: Session,
    job: JobInfo,
    detail: str,
    could_fit: bool,
    placed: int,
    counts: dict[str, int],
) -> Failure:
    need = session.needed(job)
    if placed == 0 and need <= 1:
        code = Code.WAITING_FOR_RESOURCES if could_fit else Code.NEVER_FITS
        return Failure(code, detail, could_fit, detail, counts)
    if could_fit:
        shape = session.shape(job)
        ever = session.ever_fits.get((shape, need)) if shape is not None else None
        if ever is None:
            ever = _gang_could_ever_fit(session, job)
            if shape is not None:
                session.ever_fits[(shape, need)] = ever
        could_fit = ever
    return Failure(
        Code.GANG_INCOMPLETE if could_fit else Code.NEVER_FITS,
        f"gang: {placed}/{need} tasks placeable; {detail}",
        could_fit,
        detail,
        counts,
    )


def _gang_could_ever_fit(session: Session, job: JobInfo) -> bool:
    """Would the gang fit on an empty cluster? If not, no amount of waiting helps."""
    if any(task.gpu_share for task in session.pending_tasks(job)):
        return _fractions_could_ever_fit(session, job)
    room = {n.name: n.capacity() for n in session.nodes if n.ready}
    return simulate(session, job, room) is not None


def _fractions_could_ever_fit(session: Session, job: JobInfo) -> bool:
    """`_gang_could_ever_fit` for a gang with fractions: first fit on the empty cluster,
    device by device, fractions sharing devices and whole GPUs taking whole ones."""
    room = {
        n.name: (n.allocatable.cpu, n.allocatable.memory, [sharing.MILLI] * n.healthy_devices)
        for n in session.nodes
        if n.ready
    }
    instances = {n.name: _all_instances(n) for n in session.nodes if n.ready}
    for task in session.pending_tasks(job)[: session.needed(job)]:
        for node in session.eligible_nodes(job, task):
            cpu, memory, devices = room[node.name]
            if task.gpu_mig:
                free = instances[node.name]
                if free[task.gpu_mig] < 1 or task.resources.cpu > cpu:
                    continue
                if task.resources.memory > memory:
                    continue
                free[task.gpu_mig] -= 1
                room[node.name] = (
                    cpu - task.resources.cpu,
                    memory - task.resources.memory,
                    devices,
                )
                break
            request = task.resources
            if request.cpu > cpu or request.memory > memory:
                continue
            wanted = task.gpu_share or sharing.MILLI
            picked = [i for i, free in enumerate(devices) if free >= wanted]
            picked = picked[:1] if task.gpu_share else picked[: request.gpu]
            if len(picked) < (1 if task.gpu_share else request.gpu):
                continue
            for i in picked:
                devices[i] -= wanted
            room[node.name] = (cpu - request.cpu, memory - request.memory, devices)
            break
        else:
            return False
    return True


def _copies(cpu: int, memory: int, gpu: int, free: Resources, most: int, per: int = 0) -> int:
    """How many tasks of `cpu`, `memory` and `gpu` each fit in `free`, at most `most`; with
    `per`, the tasks are alike fractions of a GPU, `per` of them to a free device."""
    if cpu and free.cpu // cpu < most:
        most = free.cpu // cpu
    if memory and free.memory // memory < most:
        most = free.memory // memory
    if per:
        most = min(most, free.gpu * per)
    elif gpu and free.gpu // gpu < most:
        most = free.gpu // gpu
    return most


def _all_instances(node: NodeView) -> Counter[str]:
    """The node's MIG instances per profile, free or not (the cluster empty)."""
    return Counter(node.mig_total)


def simulate(
    session: Session,
    job: JobInfo,
    room: dict[str, Resources],
    instances: dict[tuple[str, str], int] | None = None,
) -> dict[str, Resources] | None:
    """First-fit the job's gang (its `needed` pending tasks) into `room`; usage per node.
    A run of alike tasks fills each node it reaches as far as it can before the next one,
    which is where task-by-task first fit puts them too (room only shrinks as they go).
    With `instances` ((node, MIG profile) -> how many are free), a MIG task also takes one
    of its profile there, out of `instances`; without, MIG instances are not looked at."""
    runs = session.gang_runs(job)
    if len(runs) > 1:
        room = dict(room)  # later runs see what earlier ones took; one run only reads it
    used: dict[str, Resources] = {}
    for task, count in runs:
        request = task.resources
        cpu, memory, gpu = request.cpu, request.memory, request.gpu
        # A run of fractions shares devices: `per` of them to each device it opens.
        per = sharing.per_device(task) if task.gpu_share and not task.gpu_mig else 0
        names = session.eligible_names(job, task)
        last = len(names)
        profile = task.gpu_mig if instances is not None else ""
        free_instances = instances if instances is not None else {}
        i = 0
        while count:
            while i < last:
                free = room.get(names[i])
                if free is not None and cpu <= free.cpu and memory <= free.memory:
                    if gpu <= free.gpu and (not profile or free_instances.get((names[i], profile))):
                        break
                i += 1
            else:
                return None
            name = names[i]
            taken = _copies(cpu, memory, gpu, free, count, per)  # at most the rest of the run
            if profile:
                taken = min(taken, free_instances[(name, profile)])
                free_instances[(name, profile)] -= taken
            devices = -(-taken // per) if per else gpu * taken
            block = request if taken == 1 else Resources(cpu * taken, memory * taken, devices)
            if len(runs) > 1:
                room[name] = free - block
                used[name] = used[name] + block if name in used else block
            else:
                used[name] = block  # one run visits each node once
            count -= taken
            i += 1
    return used


# --- allocate ----------------------------------------------------------------------------


def allocate(session: Session) -> None:
    """Start jobs in order. With strict order, stop at the first job blocked by resources:
    the jobs after it may only start through backfill, which protects its reservation."""
    memo = Memo()
    strict = session.config.strict_order
    for job in in_order(session, skip_ids=session.failures):
        if session.blocked is not None and strict:
            break
        try:  # `guarded`, without a closure per job
            failure = place(session, job, "allocate", memo)
            if failure is None:
                continue
            session.failures[job.id] = failure
            session.set_pending(job, session.status_of(failure))
            if failure.blocked_by_resources and session.blocked is None:
                session.blocked = job
        except Exception as exc:  # noqa: BLE001 - fault isolation is the point
            record_fault(session, job, exc)
    if session.blocked is not None and session.config.strict_order and session.explain_failures:
        message = f"waiting for job {session.blocked.id} (first in order)"
        # One status for all, made each job's own at the end of the cycle where it is still
        # theirs (`Session.own_statuses`): most are given another by backfill, or start.
        shared = session.behind_blocked = Status(Code.PRIORITY, message)
        # (`set_pending`, spelled out: once per job waiting. Nothing is placed or refused
        # while they are: one skip set, and the queues' order stays as it is.)
        skip = session.failures.keys() | session.placed
        session.pending.update(zip(map(_job_id, in_order_unchanged(session, skip)), repeat(shared)))


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
Select = Callable[[JobInfo, list[JobInfo]], list[JobInfo]]


def _evict_for(session: Session, reason: str, select: Select) -> None:
    waiting = [
        session.jobs[i]
        for i, f in session.failures.items()
        if f.blocked_by_resources and i not in session.pipelined and i not in session.placed
    ]
    waiting.sort(key=session.job_key)
    if not waiting:
        return
    # What runs on the nodes changes only between cycles (binds and evictions leave
    # `NodeView.tasks` as it is): their fractions are looked for once, not per waiting job.
    fractions = _fractions(session)
    for job in waiting[:MAX_EVICTION_ATTEMPTS]:

        def work(job: JobInfo = job) -> None:
            _evict_one(session, job, reason, select, fractions)

        guarded(session, job, work)


Fractions = list[tuple[str, JobInfo, TaskInfo]]


def _fractions(session: Session) -> Fractions:
    """Each fraction of a device (not a MIG instance) running on a node, with its node's
    name and its job, in node order. Only on the nodes that held fractions when the session
    opened, unless it is a standing one (whose nodes' tasks change between cycles)."""
    return [
        (node.name, job, task)
        for node in (session.nodes if session.standing else session.fraction_nodes)
        for job, task in node.tasks
        if task.gpu_share and not task.gpu_mig
    ]


def _future_room(
    session: Session, fractions: Fractions | None = None
) -> tuple[dict[str, Resources], _SharedDevices]:
    """What each ready node will have once the tasks being released are gone (a shared
    device whose every occupant is being released comes back whole), and its shared
    devices' occupants that still hold them (`fractions`: `_fractions(session)`)."""
    room = {}
    shared = _SharedDevices(session, fractions)
    released, nominated = shared.released, session.nominated
    for node in session.nodes:
        if node.ready and node.name not in nominated:
            # (`node.free() + node.releasing()` and the whole devices, in one tuple)
            room[node.name] = tuple_new(
                Resources,
                (
                    node.free_cpu + node.rel_cpu,
                    node.free_memory + node.rel_memory,
                    len(node.free_devices) + node.rel_devices + released.get(node.name, 0),
                ),
            )
    return room, shared


class _SharedDevices:
    """Per shared device (fractions, not MIG instances), how many occupants still hold it:
    running, not being released, not evicted. Evicting its last holder gives the device
    back whole, so a whole-GPU job may preempt the fractions on it (within the policy)."""

    def __init__(self, session: Session, fractions: Fractions | None = None) -> None:
        self.holding: Counter[tuple[str, int]] = Counter()
        occupied: set[tuple[str, int]] = set()
        for name, job, task in _fractions(session) if fractions is None else fractions:
            gone = task.state == "Releasing" or job.suspend_requested
            for device in task.devices:
                occupied.add((name, device))
                if not gone and job.id not in session.evicted:
                    self.holding[(name, device)] += 1
        # Per node, its shared devices whose every occupant is being released.
        self.released: Counter[str] = Counter(n for n, d in occupied if not self.holding[(n, d)])

    def freed(self, task: TaskInfo, sign: int) -> int:
        """Whole devices the task's fraction gives back (sign +1) or takes again (-1): those
        it was the last holder of (a count; `_free_into` applies the sign)."""
        if not task.gpu_share or task.gpu_mig:
            return 0
        whole = 0
        for device in task.devices:
            key = (task.node or "", device)
            self.holding[key] -= sign
            whole += self.holding[key] == (0 if sign > 0 else 1)
        return whole


def _evict_one(
    session: Session, job: JobInfo, reason: str, select: Select, fractions: Fractions
) -> None:
    if any(task.gpu_mig for task in session.pending_tasks(job)):
        return  # the whole-device sums below cannot see MIG instances: it waits for one
    room, shared = _future_room(session, fractions)
    placement = simulate(session, job, room)
    if placement is not None:
        _pipeline(session, job, placement, [])
        return
    victims = select(job, [j for j in session.running if j.id not in session.evicted])
    if not victims:
        return
    fits = _GangRoom.of(session, job, room)
    if fits is not None and not fits.enough_with(room, victims, shared):
        return  # (nor with any of the first of them, which is all the search below tries)
    victims.sort(key=_victim_key)
    chosen: list[JobInfo] = []
    for victim in victims:
        chosen.append(victim)
        _free_into(room, victim, +1, fits, shared)
        placement = simulate(session, job, room) if fits is None or fits.enough() else None
        if placement is not None:
            break
    if placement is None:
        return
    chosen, placement = _needed(session, job, room, chosen, placement, fits, shared)
    statement = Statement(session)
    for victim in chosen:
        statement.evict(victim, reason, job)
    statement.commit(reason)
    _pipeline(session, job, placement, chosen)


def _needed(
    session: Session,
    job: JobInfo,
    room: dict[str, Resources],
    chosen: list[JobInfo],
    placement: dict[str, Resources],
    fits: _GangRoom | None,
    shared: _SharedDevices,
) -> tuple[list[JobInfo], dict[str, Resources]]:
    """Of the `chosen` victims, with whom the job fits (`placement`), only those the
    placement really needs, cheapest set first, and the placement without the others:
    each but the last, from the last back, is let go if the job fits without it. (Marked,
    not removed one by one: a gang of whole nodes may take thousands of victims, and each
    removal would search the list.)"""
    needed = [True] * len(chosen)
    for i in range(len(chosen) - 2, -1, -1):
        victim = chosen[i]
        _free_into(room, victim, -1, fits, shared)
        if fits is not None:
            # The sums say whether it still fits; the placement is made once, at the end.
            if fits.enough():
                needed[i] = False
            else:
                _free_into(room, victim, +1, fits, shared)
            continue
        trial = simulate(session, job, room)
        if trial is None:
            _free_into(room, victim, +1, None, shared)
        else:
            needed[i] = False
            placement = trial
    if fits is not None:
        found = simulate(session, job, room)  # the room of the last victim let go
        assert found is not None  # the sums said it fits
        placement = found
    return list(compress(chosen, needed)), placement


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


def _free_into(
    room: dict[str, Resources],
    victim: JobInfo,
    sign: int,
    fits: _GangRoom | None = None,
    shared: _SharedDevices | None = None,
) -> None:
    for task in victim.tasks:
        if task.node in room and task.state in ("Assigned", "Running"):
            # A fraction's device comes back whole only with its last holder (`shared`).
            devices = whole_devices(task) + (shared.freed(task, sign) if shared else 0)
            delta = Resources(task.resources.cpu, task.resources.memory, devices)
            room[task.node] = room[task.node] + delta if sign > 0 else room[task.node] - delta
            if fits is not None:
                fits.changed(task.node, room[task.node])


_HELD = ("Assigned", "Running")  # the states of the tasks an eviction frees (`_free_into`)


class _GangRoom:
    """How many tasks of a gang that is one run of alike tasks fit in a room, node by node
    and in all, kept as the room changes on a few nodes. First fit (`simulate`) fills each
    node it reaches as far as it can, so it places the gang exactly when the sum reaches
    the gang's size: `simulate` is only asked then, for the placement."""

    def __init__(
        self,
        request: Resources,
        count: int,
        names: list[str],
        room: dict[str, Resources],
        per: int = 0,
    ) -> None:
        self.request, self.count, self.per = request, count, per  # (per: as in `simulate`)
        self.eligible = set(names)
        self.each = {name: self._taken(room[name]) for name in names if name in room}
        self.total = sum(self.each.values())

    @classmethod
    def of(cls, session: Session, job: JobInfo, room: dict[str, Resources]) -> _GangRoom | None:
        runs = session.gang_runs(job)
        if len(runs) != 1:
            return None  # runs after the first see what it took: simulate them
        task, count = runs[0]
        per = sharing.per_device(task) if task.gpu_share and not task.gpu_mig else 0
        return cls(task.resources, count, session.eligible_names(job, task), room, per)

    def _taken(self, free: Resources) -> int:
        """How many of the tasks `simulate` puts on a node with `free` (at most all)."""
        cpu, memory, gpu = self.request
        if cpu > free.cpu or memory > free.memory or gpu > free.gpu:
            return 0
        return _copies(cpu, memory, gpu, free, self.count, self.per)

    def changed(self, name: str, free: Resources) -> None:
        if name in self.eligible:
            taken = self._taken(free)
            self.total += taken - self.each.get(name, 0)
            self.each[name] = taken

    def enough(self) -> bool:
        return self.total >= self.count

    def enough_with(
        self, room: dict[str, Resources], victims: list[JobInfo], shared: _SharedDevices
    ) -> bool:
        """Would the gang fit (`enough`) once every one of `victims` is freed into `room`
        (as `_free_into` frees each, from the room this was counted in)? Changing nothing:
        their tasks on the eligible nodes are gathered per node, and each such node's
        count worked out once, only where a task could fit there at all. Freeing only ever
        adds room, so a gang that does not fit with all of them fits with none of the first
        few of them either: the victim search need not start."""
        eligible = self.eligible
        on: dict[str, list[TaskInfo]] = {}
        for victim in victims:
            for task in victim.tasks:
                name = task.node
                # (Only counts on eligible nodes change, `changed`; `_free_into` frees
                # nothing elsewhere either.)
                if name in eligible and name in room and task.state in _HELD:
                    assert name is not None
                    tasks = on.get(name)
                    if tasks is None:
                        on[name] = [task]
                    else:
                        tasks.append(task)
        total, each = self.total, self.each
        holding = shared.holding  # (read only: `left` counts down from it)
        left: dict[tuple[str, int], int] = {}
        cpu_asked, memory_asked, gpu_asked = self.request
        for name, tasks in on.items():
            cpu, memory, gpu = room[name]
            for task in tasks:
                if not task.gpu_share:
                    gpu += len(task.devices)  # (`whole_devices`)
                elif not task.gpu_mig:  # (`_SharedDevices.freed`: whole with its last holder)
                    for device in task.devices:
                        key = (name, device)
                        now = left.get(key)
                        now = left[key] = (holding[key] if now is None else now) - 1
                        gpu += now == 0
            if gpu < gpu_asked:
                continue  # (it takes none, `_taken`: nor did it before, with less room)
            for task in tasks:
                cpu, memory = cpu + task.resources.cpu, memory + task.resources.memory
            if cpu < cpu_asked or memory < memory_asked:
                continue
            total += self._taken(Resources(cpu, memory, gpu)) - each.get(name, 0)
        return total >= self.count


def _victim_key(job: JobInfo) -> tuple[int, tuple[int, int, int], float]:
    """Victims are taken lowest priority first, then smallest (what they hold, GPUs first,
    in thousandths: a fraction as its share; then cpu, memory), then latest started (the
    latest start of any of their tasks)."""
    gpu = cpu = memory = 0
    start: float | None = None
    for task in job.tasks:
        if task.state in ("Assigned", "Running"):
            cpu += task.resources.cpu
            memory += task.resources.memory
            gpu += sharing.gpu_milli(task)
        started = task.started_at or 0.0
        if start is None or started > start:
            start = started
    return (job.priority, (gpu, cpu, memory), -(start if start is not None else 0.0))
