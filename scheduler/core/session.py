"""A session over the cluster: the mutable view actions work on, the plugin interface and the
combined plugin functions.

Nodes that can take tasks are indexed by label set and by free-device count, so finding a node
for a task looks at a few candidates instead of every node. Actions never call plugins
directly: they call the session's combined functions (`job_key`, `queue_key`, `predicate`,
`job_ready`, `preemptable`, `reclaimable`, `overused`, `candidate_nodes`), which ask every
plugin that implements the hook.

A session usually lives for one cycle (`run_cycle`). A standing session (`StandingSession`
in `scheduler.core.standing`) keeps it between cycles and applies arrivals, completions and
its own binds to it, so nothing is rebuilt that did not change; `begin_cycle` clears what one
cycle decided.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from itertools import compress, islice, repeat
from operator import attrgetter, eq, is_, itemgetter, lt, ne
from typing import Any, cast

from scheduler.core import gpushare, predict, sharing
from scheduler.core.model import JobInfo, NodeInfo, SchedulingPolicy, Snapshot, TaskInfo
from scheduler.core.priority import Factors
from scheduler.core.resources import Resources
from scheduler.core.status import Status
from scheduler.core.types import (
    HOLDS_RESOURCES,
    Bind,
    Evict,
    Failure,
    LabelGroup,
    NodeView,
    QueueState,
    Reservation,
)

_UNKNOWN: Any = object()
Fits = Callable[[NodeView, TaskInfo], bool]
# (resources, node selector, the fraction: () or (share, gpu memory, modes))
Shape = tuple[Resources, tuple[tuple[str, str], ...], tuple[object, ...]]
# When a running task gives its resources back: (end, node, task id, job id, resources).
End = tuple[float, str, int, int, Resources]


class Plugin:
    """What a plugin may say; a hook with nothing to say returns the neutral value (an empty
    key, None, True, the victims unchanged). Keys and predicates must depend only on the job
    or task, the node, and the queue's own state: the session caches them on that basis."""

    name = "plugin"
    # True if `node_order` depends on nodes' free devices only (not on free cpu or memory),
    # so a node scan may resume after placing a task without devices.
    static_node_order = False
    # True if `predicate` only says what the node index already guarantees of the nodes it
    # offers for placing (Ready, labels matching the selector): not asked when placing.
    implied_by_index = False
    # True if `overused` says None for every job of a queue without a capability or per-user
    # limits, and elsewhere the same for alike jobs (same pending task shape, gang size,
    # queue and owner, each ending before the reservation's start or both not) as long as
    # nothing is bound or evicted: backfill then refuses such jobs together
    # (`scheduler.core.backfill`).
    alike_overused = False
    # True if `job_valid` says None for every job of an open queue without a capability:
    # enqueue then asks it only of the jobs of other queues.
    valid_in_open_queue = False
    # True if the keys of `keys_with_ids` hold ints and floats only, and a key holding NaN
    # holds it first: `Session.key_order` may then sort them by their first items and
    # settle ties after (`sorted_by_first`).
    numbers_first_nan = False

    def open(self, session: Session) -> None:
        """Called once when the session opens."""

    def job_key(self, session: Session, job: JobInfo) -> tuple[Any, ...]:
        """The job's place in its queue (keys are compared, least first). A plugin may also
        offer `keys_with_ids(session, jobs)`, the keys of many jobs at once, each equal to
        its `job_key` with the job's id after it (`job_key(job) + (job.id,)`, the session's
        key): `Session.key_all` asks it when it is the only plugin keying jobs."""
        return ()

    def queue_key(self, session: Session, queue: QueueState) -> tuple[Any, ...]:
        return ()

    def job_valid(self, session: Session, job: JobInfo) -> Status | None:
        return None

    def overused(self, session: Session, queue: QueueState, job: JobInfo) -> Status | None:
        return None

    def predicate(
        self, session: Session, job: JobInfo, task: TaskInfo, node: NodeView
    ) -> str | None:
        return None

    def job_ready(self, session: Session, job: JobInfo, placed: int) -> bool:
        return True

    def preemptable(
        self, session: Session, preemptor: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return victims

    def reclaimable(
        self, session: Session, reclaimer: JobInfo, victims: list[JobInfo]
    ) -> list[JobInfo]:
        return victims

    def node_order(
        self, session: Session, task: TaskInfo, groups: list[LabelGroup]
    ) -> Iterator[NodeView] | None:
        """The nodes of `groups` to try for the task, in order (None: no say). While
        `session.walking_once` the caller changes nothing in the index until it is done
        with the order."""
        return None


HOOKS = (
    "job_key", "queue_key", "job_valid", "overused", "predicate", "job_ready", "preemptable",
    "reclaimable", "node_order",
)  # fmt: skip


def _implementing(plugins: list[Plugin], hook: str) -> list[Plugin]:
    return [p for p in plugins if getattr(type(p), hook, None) is not getattr(Plugin, hook)]


class Session:
    def __init__(
        self,
        snapshot: Snapshot,
        config: SchedulingPolicy,
        plugins: list[Plugin],
        explain: bool = True,
    ) -> None:
        self.now = snapshot.now
        self.config = config
        self.plugins = plugins
        # False: failures say only their code (no per-node counts); decisions are the same.
        self.explain_failures = explain
        self.hooks = {hook: _implementing(plugins, hook) for hook in HOOKS}
        # Predicates asked when placing: not those the node index already answers.
        self.placing_predicates = [p for p in self.hooks["predicate"] if not p.implied_by_index]
        self.static_node_order = all(p.static_node_order for p in self.hooks["node_order"])
        self.gang_decides = any(p.name == "gang" for p in self.hooks["job_ready"])
        self.walking_once = False  # `walk_once`
        # Every `overused` says None for a queue without a capability or per-user limits.
        self.limits_only_overuse = all(p.alike_overused for p in self.hooks["overused"])
        # Every `job_valid` says None for a job of an open queue without a capability.
        self.open_queues_valid = all(p.valid_in_open_queue for p in self.hooks["job_valid"])
        self._open_shortcuts()
        self._open_nodes(snapshot.nodes)
        self.queues = {q.name: QueueState(q) for q in snapshot.queues}
        # Queues with per-user limits: there a job's refusal depends on its owner too.
        self.user_limited = {q.name for q in snapshot.queues if q.user_limited}
        self.usage, self.shares = snapshot.usage, snapshot.shares
        self.factors: dict[int, Factors] = {}  # job -> its priority factors, when weighted
        self.jobs = {j.id: j for j in snapshot.jobs}
        # A Running job with pending tasks left (a gang started with min_available) is a
        # candidate for the rest, unless it is being stopped.
        self.candidates, self.need, self.running, pending, holders = _sort_out(snapshot.jobs)
        self._open_caches(pending)
        loaded = holders if len(self.jobs) == len(snapshot.jobs) else self.jobs.values()
        self._open_totals(*self._load_running(loaded))
        # A standing session keeps its queues' admitted jobs between cycles, and why it
        # refused the others (job -> status).
        self.standing = False
        self.refused: dict[int, Status] = {}
        self.index_dirty = True
        self.begin_cycle(snapshot.now)
        for plugin in self.plugins:
            plugin.open(self)

    def _open_shortcuts(self) -> None:
        """Shortcuts that decide as the long way does (False only to compare the two in
        tests)."""
        # A job's alike tasks without devices placed in one scan rather than one by one.
        self.alike_at_once = True
        # A job that needs its one pending task placed without a statement's task loop
        # (`actions._place_single`).
        self.single_at_once = True
        # Backfill starts such a job in one call (`backfill._Backfill._start_single`) rather
        # than through `_try`, `place` and `_place_single`.
        self.single_in_backfill = True
        # Backfill refuses a job as the last alike job was refused when nothing that decides
        # it changed since (`scheduler.core.backfill`).
        self.alike_refusals = all(p.alike_overused for p in self.hooks["overused"])
        # It takes such a refusal as it stands, without comparing what decides it, when no
        # job was tried since it was last known to stand (`backfill._Backfill.tried`).
        self.refusals_by_tries = True

    def _open_nodes(self, infos: list[NodeInfo]) -> None:
        """The nodes' views, by name, and what the cluster has in all."""
        self.nodes = nodes = [NodeView(n) for n in infos]
        self.node_by_name = {n.name: n for n in nodes}
        self.all_ready = all(n.ready for n in nodes)
        devices = list(map(_healthy_devices_of, nodes))
        self.max_devices = max(devices, default=0)
        allocatable = list(map(_allocatable_of, nodes))
        # (the sum of the nodes' `capacity`, each dimension summed on its own)
        self.total = Resources(
            sum(map(_cpu_of, allocatable)), sum(map(_memory_of, allocatable)), sum(devices)
        )

    def _open_caches(self, pending: dict[int, list[TaskInfo]]) -> None:
        """What is worked out once per job or task shape and kept (`pending`: each
        candidate's pending tasks, as `pending_tasks` says)."""
        # Nodes with less than this free can take none of the pending tasks (`LabelGroup`).
        self.floor = request_floor(pending.values())
        self._pending_tasks: dict[int, list[TaskInfo]] = pending
        self._shapes: dict[int, Shape | None] = {}
        self._min_requests: dict[int, Resources] = {}
        self._gang_runs: dict[int, list[tuple[TaskInfo, int]]] = {}
        self._alike_keys: dict[int, tuple[Shape, str, int, str] | None] = {}
        # One object per distinct alike key, which `_alike_keys` holds (`_interned_one`): a
        # backlog has a few dozen, so hashing and comparing them (and their shapes) finds
        # them in the cache, where each job's own copy lay wherever the job was made.
        self._interned: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._job_keys: dict[int, tuple[Any, ...]] = {}
        self._eligible: dict[Shape, list[NodeView]] = {}
        self._eligible_names: dict[Shape, list[str]] = {}
        self._static: dict[Shape, tuple[tuple[Counter[str], dict[str, int]], list[int]]] = {}
        # Each node's kind (numbered as first seen), in position order, and the first node
        # of each kind (`_reasons_by_kind`).
        self._node_kinds: tuple[list[int], list[NodeView]] | None = None
        # Each node name's positions in `nodes` (`_nominated_marks`), made when first asked.
        self._node_positions: dict[str, list[int]] | None = None
        self.ever_fits: dict[tuple[Shape, int], bool] = {}
        self.refusals: dict[tuple[Shape | None, int], Failure] = {}
        # The backfill's quick refusals, with the state they were made in (what is free and
        # allocated): per (shape, queue, need), and per job with its status.
        self.quick_refusals: dict[tuple[object, ...], tuple[tuple[object, ...], Failure]] = {}
        self.kept_refusals: dict[int, tuple[tuple[object, ...], Failure, Status]] = {}
        # The status of each of `refusals` (by id: they are kept as long as the session).
        self.refusal_statuses: dict[int, Status] = {}
        # Bumped whenever what runs where changes for good (commits, completions): what
        # was computed from it at the same version still holds.
        self.version = 0
        # The last reservation plan: key (job, version, nominated, evicted) -> (first walltime
        # end, plan, None) as computed, or (.., .., valid from) once carried across changes
        # that provably leave it as it is (`carry_plan`).
        self.reservations: dict[tuple[object, ...], tuple[Any, ...]] = {}
        self.plan_harmless: set[int] = set()  # backfilled this cycle, ending before the plan
        # job -> the estimated start of the first reservation it held (with a known start)
        self.reservation_starts: dict[int, float] = {}

    def _open_totals(
        self,
        ends: list[End],
        fraction_ends: list[tuple[JobInfo, TaskInfo, str]],
        fractions: set[str],
        releasing: int,
    ) -> None:
        """What is free on each ready node and in total, kept as tasks are placed and
        released; when each task with a walltime gives its resources back: (end, node, task
        id, job id, resources), sorted (Releasing tasks are not in it: `releasing` counts
        them). From `_load_running`: `ends`, those of the tasks on nodes but fractions of a
        device, and `fraction_ends`, the fractions with a planned end (with their jobs and
        nodes: what a fraction gives back waits for `releasers`); `fractions`: the nodes
        where some tasks hold a fraction of a device; `releasing`: the Releasing tasks."""
        self.ready_free = {n.name: n.free() for n in self.nodes if n.ready}
        free = self.ready_free.values()
        self.ready_free_cpu = sum(map(_cpu_of, free))
        self.ready_free_memory = sum(map(_memory_of, free))
        self.ready_free_gpu = sum(map(_gpu_of, free))
        self._stale_free: set[NodeView] = set()
        self.releasing = releasing
        # Per shared device, the task whose end gives it back whole (`sharing.releasers`:
        # only nodes holding fractions have any); none for a device a fraction bound since
        # holds (node, device: `pinned`).
        # (What runs on a node changes only in a standing session, between cycles: until
        # then these are the nodes holding fractions.)
        self.fraction_nodes = [n for n in self.nodes if n.name in fractions] if fractions else []
        self.releasers = sharing.releasers(self.fraction_nodes, self.leaves_at)
        self.pinned: set[tuple[str, int]] = set()
        ends += self.end_entries(fraction_ends)
        sort_ends(ends)  # one sort for the whole cluster, not one per node
        self.walltime_ends: list[End] = ends

    def begin_cycle(self, now: float) -> None:
        """Forget what the last cycle decided; keep the cluster as it stands."""
        self.now = now
        self.pending: dict[int, Status] = {}
        self.binds: list[Bind] = []
        # What each bind bound, in the same order: (job, task, node, devices).
        self.bound: list[tuple[JobInfo, TaskInfo, NodeView, tuple[int, ...]]] = []
        self.evictions: list[Evict] = []
        self.placed: set[int] = set()
        self.evicted: set[int] = set()
        self.pipelined: dict[int, list[str]] = {}  # job -> nodes nominated for it
        self.nominated: set[str] = set()
        self.failures: dict[int, Failure] = {}
        self.blocked: JobInfo | None = None  # first job strict allocate could not start
        # The one status strict allocate gives every job after `blocked` (most are given
        # another later, or start): `own_statuses` gives each job still holding it its own.
        self.behind_blocked: Status | None = None
        self.reservation: Reservation | None = None
        self.stats: Counter[str] = Counter()
        self.plan_harmless = set()
        # The nodes whose free resources changed, in order, since the cycle began (`freed`,
        # `took`), and `_shortfalls`' answers, each valid up to a length of it.
        self.changed: list[NodeView] = []
        self._shorts: dict[tuple[int, int, int], tuple[list[NodeView], bytearray, list[int]]]
        self._shorts = {}
        self._indices: dict[int, tuple[list[NodeView], dict[NodeView, int]]] = {}
        self._same: dict[int, tuple[list[NodeView], list[NodeView]]] = {}
        self._by_nodes: dict[tuple[int, ...], list[NodeView]] = {}
        if not self.standing:
            for queue in self.queues.values():
                queue.jobs = []
        if self.index_dirty:
            self._build_index()

    def _load_running(
        self, jobs: Iterable[JobInfo]
    ) -> tuple[list[End], list[tuple[JobInfo, TaskInfo, str]], set[str], int]:
        """What the tasks of `jobs` (every job that may hold something, in snapshot order;
        all of `self.jobs` where two jobs share an id) hold, taken from their nodes (each
        node's `tasks` in job order) and counted for their queues; and, in the same pass, for
        `_open_totals`: their planned ends (`end_entries`, unsorted) but those of fractions
        of a device, left to it with their jobs and nodes (what a fraction gives back waits
        for `releasers`), the nodes where a fraction (not a MIG instance) is held, and how
        many tasks are Releasing."""
        correction = self.config.prediction_correction
        ends, fraction_ends, fractions, releasing, held = _load_tasks(
            jobs, self.node_by_name.get, self.now, correction
        )
        self._count_held(held)
        return ends, fraction_ends, fractions, releasing

    def _count_held(self, held: dict[str, list[int]]) -> None:
        """Add what each queue's jobs hold (queue -> cpu, memory, whole devices, fractions
        in thousandths) to what it holds: each queue's sum at once, the same figures as
        adding each job's in turn."""
        for name, (cpu, memory, gpu, shared) in held.items():
            queue = self.queues.get(name)
            if queue is None:
                continue
            if cpu or memory or gpu:
                queue.allocated = queue.allocated + Resources(cpu, memory, gpu)
            queue.shared_gpu += shared

    def _build_index(self) -> None:
        """Ready nodes by label set, then by free devices, each bucket in snapshot order."""
        self._groups: dict[tuple[tuple[str, str], ...], LabelGroup] = {}
        self._selector_groups: dict[tuple[tuple[str, str], ...], list[LabelGroup]] = {}
        for node in self.nodes:
            if node.ready:
                group = self._groups.get(node.label_key)
                if group is None:
                    group = LabelGroup(node.labels, self.floor)
                    self._groups[node.label_key] = group
                group.add(node)
        self.index_dirty = False
        self._orders: dict[tuple[object, ...], list[NodeView]] = {}

    def carry_plan(self, valid_from: float | None = None) -> None:
        """The change that just bumped `version` leaves the last reservation plan as it was
        for every moment up to its start (from `valid_from` on): keep it for this version.

        Only for a holder whose gang is one run of alike tasks (whether it fits is then
        monotone in the room, so a change that only lowers the room before the start cannot
        make it fit earlier), a known start, and no evictions, nominations or releasing."""
        entry = next(iter(self.reservations.items()), None)
        self.reservations = {}
        if entry is None or self.releasing or self.evicted or self.nominated:
            return
        key, (first_end, plan, since) = entry
        job = self.jobs.get(key[0])  # type: ignore[call-overload]
        if key[1] != self.version - 1 or plan[0] is None or job is None:
            return
        if len(self.gang_runs(job)) != 1 or (valid_from is not None and valid_from > plan[0]):
            return  # (a change after the start changes the room at the start)
        since = max(
            since if since is not None else self.now,
            valid_from if valid_from is not None else self.now,
        )
        self.reservations = {(key[0], self.version, *key[2:]): (first_end, plan, since)}

    def end_entries(self, started: list[tuple[JobInfo, TaskInfo, str]]) -> list[End]:
        """Tasks started on nodes (with their jobs and nodes): when their walltimes give
        their resources back, as `walltime_ends` holds them (unsorted; a task without a
        planned end has none)."""
        correction = self.config.prediction_correction
        ends: list[End] = []
        append = ends.append
        for job, task, node in started:
            if job.walltime is None or task.started_at is None or task.state == "Releasing":
                continue
            if job.predicted is None:
                at = task.started_at + job.walltime
            else:  # its prediction, raised as often as the job has outlived it
                at = predict.end(job, task.started_at, self.now, correction) or 0.0
            request = task.resources
            release = (
                request  # the same figures: no need for a new tuple
                if request.gpu == len(task.devices) and not task.gpu_share
                else Resources(request.cpu, request.memory, self.device_release(task))
            )
            # ((end, node, task id) is unique unless two tasks share an id: `sort_ends`)
            append((at, node, task.id, job.id, release))
        return ends

    def end_of(self, job: JobInfo, task: TaskInfo) -> float | None:
        """When the task gives its resources back as `end_entries` plans it (None: unknown)."""
        if job.walltime is None or task.started_at is None or task.state == "Releasing":
            return None
        if job.predicted is None:
            return task.started_at + job.walltime
        return predict.end(job, task.started_at, self.now, self.config.prediction_correction)

    def leaves_at(self, job: JobInfo, task: TaskInfo) -> float | None:
        """When the task really leaves its node, as far as a shared device's occupants go:
        now if it is being released or its job suspended, else its planned end (None:
        unknown). The occupant that leaves last gives the device back whole (`releasers`)."""
        if task.state == "Releasing" or job.suspend_requested:
            return self.now
        return self.end_of(job, task)

    def device_release(self, task: TaskInfo) -> int:
        """Whole devices the task gives back when it ends: a fraction gives back its device
        only if it is the device's last occupant (`releasers`)."""
        if task.gpu_share:
            return 1 if task.id in self.releasers else 0  # (never a MIG instance's)
        return len(task.devices)

    def pin_shared(self, node: NodeView, device: int) -> None:
        """A fraction bound this cycle holds the device, with no end planned: in plans the
        device comes back whole never (as a whole device bound this cycle), not at the end
        of the running occupant that was to give it back."""
        self.pinned.add((node.name, device))
        self.recount_releaser(node, device)

    def recount_releaser(self, node: NodeView, device: int) -> None:
        """Work out again which running occupant of the shared device gives it back whole
        (`sharing.releaser`; none while it is `pinned`) after a fraction joined or left it:
        its planned end (`walltime_ends`) gives back the device, the others' none."""
        occupants = sharing.occupants(node, device)
        if not occupants:
            return
        pinned = (node.name, device) in self.pinned
        chosen = None if pinned else sharing.releaser(occupants, self.leaves_at)
        for job, task in occupants:
            releases = task.id == chosen
            if (task.id in self.releasers) == releases:
                continue
            if releases:
                self.releasers.add(task.id)
            else:
                self.releasers.discard(task.id)
            self._set_release(job, task, int(releases))

    def _set_release(self, job: JobInfo, task: TaskInfo, devices: int) -> None:
        """The task's planned end (if it has one) gives back `devices` whole devices."""
        ends = self.walltime_ends
        at = self.end_of(job, task)
        i = bisect.bisect_left(ends, (at,)) if at is not None else len(ends)
        while i < len(ends) and ends[i][0] == at and ends[i][2] != task.id:
            i += 1
        if i == len(ends) or ends[i][2] != task.id:  # not where its end says: anywhere
            i = next((k for k, entry in enumerate(ends) if entry[2] == task.id), -1)
            if i < 0:
                return  # no end planned
        at_i, name, task_id, job_id, release = ends[i]
        ends[i] = (at_i, name, task_id, job_id, Resources(release.cpu, release.memory, devices))

    @property
    def gpu_policy(self) -> gpushare.Policy:
        """Where fractions go (`sharing.policy_for`), made when first asked."""
        policy = getattr(self, "_gpu_policy", None)
        if policy is None:
            tasks = [t for j in self.jobs.values() for t in j.tasks]
            policy = self._gpu_policy = sharing.policy_for(self.config.gpu_placement, tasks)
        return policy

    def raise_outlived(self) -> None:
        """Running jobs still running at their predicted end get a later one
        (`predict.end`); the plans made with the old ends are forgotten. Jobs planned by
        their walltime are left as they are."""
        ends = self.walltime_ends
        count = 0
        while count < len(ends) and ends[count][0] <= self.now:
            count += 1
        changed = False
        correction = self.config.prediction_correction
        for i in range(count):
            at, node, task_id, job_id, release = ends[i]
            job = self.jobs.get(job_id)
            if job is None or job.predicted is None:
                continue
            started = next(t.started_at for t in job.tasks if t.id == task_id)
            later = predict.end(job, started or 0.0, self.now, correction) or at
            if later != at:
                ends[i] = (later, node, task_id, job_id, release)
                changed = True
        if changed:
            ends.sort()
            self.version += 1
            self.reservations = {}

    def freed(self, node: NodeView, cpu: int, memory: int, gpu: int, moved: bool = False) -> None:
        """The node's free resources changed by (cpu, memory, gpu). `moved`: the node was
        just moved in the index with them (`move_in_index`), which put it in its group's
        `roomy` as they are: nothing left to resize. Every change to what a node has free
        comes through here or `took` (`changed` keeps `explain`'s answers up to date)."""
        self.changed.append(node)
        if node.ready:
            self.ready_free_cpu += cpu
            self.ready_free_memory += memory
            self.ready_free_gpu += gpu
            self._stale_free.add(node)
            if not moved:
                self._resized(node)

    def took(self, nodes: list[NodeView], cpu: int, memory: int) -> None:
        """`freed` for ready nodes that together gave `cpu` and `memory` (no devices)."""
        self.changed.extend(nodes)
        self.ready_free_cpu -= cpu
        self.ready_free_memory -= memory
        self._stale_free.update(nodes)
        for node in nodes:
            self._resized(node)

    def _resized(self, node: NodeView) -> None:
        """The node's free cpu or memory changed: keep its group's `roomy` true; a node back
        in it may be in an order kept by `ordered_nodes`, which is then made again."""
        group = self._groups.get(node.label_key)
        if group is not None and group.resized(node) and self._orders:
            self._orders = {}

    def free_on_ready_nodes(self) -> dict[str, Resources]:
        """What is free on each ready node now."""
        for node in self._stale_free:
            self.ready_free[node.name] = node.free()
        self._stale_free.clear()
        return self.ready_free

    def move_in_index(self, node: NodeView, old_free: int) -> None:
        """The node's free device count changed from `old_free`."""
        self._groups[node.label_key].move(node, old_free)
        self.index_dirty = True  # buckets are no longer in snapshot order
        if self._orders:
            self._orders = {}

    # --- per job, cached while its pending tasks do not change ---------------------------

    def pending_tasks(self, job: JobInfo) -> list[TaskInfo]:
        tasks = self._pending_tasks.get(job.id)
        if tasks is None:
            tasks = self._pending_tasks[job.id] = [t for t in job.tasks if t.state == "Pending"]
        return tasks

    def have_pending(self, jobs: list[JobInfo]) -> list[bool]:
        """Whether each of `jobs` has a pending task (`pending_tasks`), in one pass without
        a call per job where all of them are known (as the candidates are, once sorted
        out)."""
        tasks = list(map(self._pending_tasks.get, map(_job_id, jobs)))
        if None in tasks:
            tasks = list(map(self.pending_tasks, jobs))
        return list(map(bool, tasks))

    def shape(self, job: JobInfo) -> Shape | None:
        """(resources, node selector) of the job's pending tasks if they are all alike."""
        known = self._shapes.get(job.id, _UNKNOWN)
        if known is not _UNKNOWN:
            return known
        key = self._alike_keys.get(job.id, _UNKNOWN)
        if key is not _UNKNOWN:  # (its alike key holds it: an equal shape, or None)
            return None if key is None else key[0]  # type: ignore[no-any-return]
        return self._new_shape(job)

    def _new_shape(self, job: JobInfo) -> Shape | None:
        """`shape`, worked out and kept."""
        shape = self._shapes[job.id] = pending_shape(self.pending_tasks(job))
        return shape

    def _interned_one(self, value: tuple[Any, ...]) -> Any:
        """The one object equal to `value` that alike keys use (`_interned`; forgotten
        past 4096 of them: equal values stay equal, only the sharing stops)."""
        interned = self._interned
        known = interned.get(value)
        if known is None:
            if len(interned) >= 4096:
                interned.clear()
            known = interned[value] = value
        return known

    def alike_key(self, job: JobInfo) -> tuple[Shape, str, int, str] | None:
        """(shape, queue, gang size, owner) of a job whose pending tasks are alike, else
        None; the owner only in a queue with per-user limits (elsewhere it is "")."""
        key = self._alike_keys.get(job.id, _UNKNOWN)
        if key is _UNKNOWN:
            self._new_alike_keys([job])
            key = self._alike_keys[job.id]
        return key  # type: ignore[no-any-return]

    def prefill_alike_keys(self, jobs: list[JobInfo]) -> None:
        """`alike_key` of each of `jobs`, made now (each is kept until its job's pending
        tasks change: asked later, it is the same). Made in snapshot order, the jobs, their
        tasks and the keys are walked in the order they lie in memory; asked first in
        priority order (backfill's), each job's key cost about four times as much, in
        cache misses."""
        self._new_alike_keys(jobs)

    def _new_alike_keys(self, jobs: list[JobInfo]) -> None:
        """`alike_key` of each of `jobs` not known yet, worked out and kept: each from the
        job's pending tasks (`pending_shape`), whatever `shape` knows (the same shape).
        `shape` is not kept here, but read off the key when asked (a few dozen jobs of a
        backlog are)."""
        known, pending, need_of = self._alike_keys, self._pending_tasks, self.need
        limited, interned = self.user_limited, self._interned
        for job in jobs:
            job_id = job.id
            if job_id in known:
                continue
            tasks = pending.get(job_id)
            shape = pending_shape(self.pending_tasks(job) if tasks is None else tasks)
            key = None
            if shape is not None:
                queue = job.queue
                need = need_of.get(job_id)  # `needed`
                value = (
                    shape,
                    queue,
                    job.min_available if need is None else need,
                    job.owner if queue in limited else "",
                )
                key = interned.get(value)
                if key is None:
                    key = self._interned_one(value)
            known[job_id] = key

    def gang_runs(self, job: JobInfo) -> list[tuple[TaskInfo, int]]:
        """The gang (the first `needed` pending tasks) as runs of consecutive alike tasks:
        (the first of them, how many)."""
        runs = self._gang_runs.get(job.id)
        if runs is None:
            runs = []
            for task in self.pending_tasks(job)[: self.needed(job)]:
                last = runs[-1][0] if runs else None
                if last is not None and alike(task, last):
                    runs[-1] = (last, runs[-1][1] + 1)
                else:
                    runs.append((task, 1))
            self._gang_runs[job.id] = runs
        return runs

    def min_request(self, job: JobInfo) -> Resources:
        """What the job needs to start: its first `needed` pending tasks."""
        request = self._min_requests.get(job.id)
        if request is None:
            request = Resources()
            for task in self.pending_tasks(job)[: self.needed(job)]:
                request = request + task.resources
            self._min_requests[job.id] = request
        return request

    def min_devices(self, job: JobInfo) -> int:
        """The whole devices the job needs to start (its `min_request`'s gpu, with each
        run of alike fractions packed onto as few devices as their shares allow, as
        `actions.simulate` places them; a MIG instance needs none)."""
        devices = 0
        for task, count in self.gang_runs(job):
            if task.gpu_share and not task.gpu_mig:
                per = sharing.per_device(task)
                devices += (count + per - 1) // per
            else:
                devices += task.resources.gpu * count
        return devices

    def min_gpu_milli(self, job: JobInfo) -> int:
        """What the job's gang asks of GPUs, in thousandths (`sharing.gpu_milli`)."""
        return sum(sharing.gpu_milli(t) for t in self.pending_tasks(job)[: self.needed(job)])

    def forget_job(self, job_id: int) -> None:
        """Its tasks changed state: drop what was cached about them."""
        self._pending_tasks.pop(job_id, None)
        self._shapes.pop(job_id, None)
        self._min_requests.pop(job_id, None)
        self._gang_runs.pop(job_id, None)
        self._alike_keys.pop(job_id, None)
        self.kept_refusals.pop(job_id, None)

    def forget_key(self, job_id: int) -> None:
        """The job is gone: its order key is no longer needed."""
        self._job_keys.pop(job_id, None)

    def needed(self, job: JobInfo) -> int:
        """Pending tasks that must be placed together for the job to (keep) run(ning)."""
        need = self.need.get(job.id)
        return job.min_available if need is None else need

    # --- combined plugin functions ---------------------------------------------------

    def job_key(self, job: JobInfo) -> tuple[Any, ...]:
        key = self._job_keys.get(job.id)
        if key is None:
            hooks = self.hooks["job_key"]
            if len(hooks) == 1:  # (the default: the priority plugin's key alone)
                key = hooks[0].job_key(self, job)
            else:
                key = ()
                for plugin in hooks:
                    key += plugin.job_key(self, job)
            key = self._job_keys[job.id] = key + (job.id,)
        return key

    def key_all(self, jobs: list[JobInfo]) -> list[tuple[Any, ...]] | None:
        """Work out the keys of those of `jobs` not keyed yet in one pass, where the one
        plugin keying jobs can (a `keys_with_ids` method, as the priority plugin's):
        `job_key` then finds them made. The same keys as one by one, in the same order.
        Returns the keys of `jobs`, in their order, where it made them all now (none was
        keyed before, no two share an id), else None."""
        hooks = self.hooks["job_key"]
        batch = getattr(hooks[0], "keys_with_ids", None) if len(hooks) == 1 else None
        if batch is None:
            return None
        known = self._job_keys
        fresh = not known
        todo = jobs if fresh else [job for job in jobs if job.id not in known]
        keys = batch(self, todo)
        if len(keys) != len(todo):
            raise ValueError(
                f"{type(hooks[0]).__name__}.keys_with_ids: {len(keys)} keys for {len(todo)} jobs"
            )
        known.update(zip(map(_job_id, todo), keys, strict=True))
        return keys if fresh and len(known) == len(jobs) else None

    def in_key_order(self, jobs: list[JobInfo]) -> list[JobInfo]:
        """`sorted(jobs, key=self.job_key)`: keyed in one pass where the plugin can
        (`key_all`), then sorted by the keys without a call per job (each ends with the
        job's id: no two are equal)."""
        return list(map(jobs.__getitem__, self.key_order(jobs)))

    def key_order(self, jobs: list[JobInfo]) -> list[int]:
        """The positions in `jobs` of `in_key_order`'s jobs, in its order."""
        keys = self.key_all(jobs)
        if keys is not None and self.hooks["job_key"][0].numbers_first_nan:
            return sorted_by_first(keys)
        if keys is None:
            known = cast(Callable[[int], tuple[Any, ...]], self._job_keys.get)  # (None: not made)
            keys = list(map(known, map(_job_id, jobs)))
            if None in keys:
                keys = list(map(self.job_key, jobs))
        at: Callable[[int], tuple[Any, ...]] = keys.__getitem__
        return sorted(range(len(jobs)), key=at)

    def refresh_keys(self) -> None:
        """Work out every job's key again and reorder the queues by them (a standing
        session whose order ages with the clock)."""
        self._job_keys.clear()
        for queue in self.queues.values():
            queue.jobs.sort(key=self.job_key)

    def queue_key(self, queue: QueueState) -> tuple[Any, ...]:
        key: tuple[Any, ...] = ()
        for plugin in self.hooks["queue_key"]:
            key += plugin.queue_key(self, queue)
        return key + (queue.info.name,)

    def job_valid(self, job: JobInfo) -> Status | None:
        for plugin in self.hooks["job_valid"]:
            problem = plugin.job_valid(self, job)
            if problem is not None:
                return problem
        return None

    def overused(self, queue: QueueState, job: JobInfo) -> Status | None:
        if (
            self.limits_only_overuse
            and queue.info.capability is None
            and queue.info.name not in self.user_limited
        ):
            return None  # what every `alike_overused` plugin says of such a queue's jobs
        for plugin in self.hooks["overused"]:
            problem = plugin.overused(self, queue, job)
            if problem is not None:
                return problem
        return None

    def predicate(self, job: JobInfo, task: TaskInfo, node: NodeView) -> str | None:
        """None if the node may run the task (resources aside), else the reason it may not."""
        for plugin in self.hooks["predicate"]:
            problem = plugin.predicate(self, job, task, node)
            if problem is not None:
                return problem
        return None

    def job_ready(self, job: JobInfo, placed: int) -> bool:
        for plugin in self.hooks["job_ready"]:
            if not plugin.job_ready(self, job, placed):
                return False
        return True

    def preemptable(self, preemptor: JobInfo, victims: list[JobInfo]) -> list[JobInfo]:
        for plugin in self.hooks["preemptable"]:
            victims = plugin.preemptable(self, preemptor, victims)
        return victims

    def reclaimable(self, reclaimer: JobInfo, victims: list[JobInfo]) -> list[JobInfo]:
        for plugin in self.hooks["reclaimable"]:
            victims = plugin.reclaimable(self, reclaimer, victims)
        return victims

    def candidate_nodes(self, task: TaskInfo) -> Iterator[NodeView]:
        """Ready nodes whose labels match the task's selector, in the preferred order."""
        groups = self._matching_groups(task.node_selector)
        for plugin in self.hooks["node_order"]:
            order = plugin.node_order(self, task, groups)
            if order is not None:
                return order
        return (n for g in groups for b in sorted(g.buckets) for n in list(g.buckets[b].values()))

    def walk_once(self, task: TaskInfo) -> Iterator[NodeView]:
        """`candidate_nodes` for a caller that walks the order once and changes nothing in
        the index while it does (`walking_once` tells `node_order` so while it is asked:
        it may then hand out the index's own buckets rather than copies)."""
        self.walking_once = True
        try:
            return self.candidate_nodes(task)
        finally:
            self.walking_once = False

    def ordered_nodes(self, task: TaskInfo) -> list[NodeView]:
        """`candidate_nodes` as a list, kept until a node moves in the index (only for an
        order that depends on free devices alone, which only such a move changes)."""
        request = task.resources
        roomy = request.cpu >= self.floor[0] and request.memory >= self.floor[1]
        key = (selector_key(task.node_selector), request.gpu, roomy, task.gpu_share > 0)
        nodes = self._orders.get(key)
        if nodes is None:
            nodes = self._orders[key] = list(self.candidate_nodes(task))
        return nodes

    def _matching_groups(self, selector: dict[str, str]) -> list[LabelGroup]:
        key = selector_key(selector)
        groups = self._selector_groups.get(key)
        if groups is None:
            groups = [
                g
                for g in self._groups.values()
                if all(g.labels.get(k) == v for k, v in selector.items())
            ]
            self._selector_groups[key] = groups
        return groups

    # --- shares ------------------------------------------------------------------------

    def share(self, allocated: Resources) -> float:
        """Dominant resource share of `allocated` over the cluster's capacity."""
        return allocated.dominant_share(self.total)

    def queue_share(self, queue: QueueState) -> float:
        """The queue's dominant share, its fractions of GPUs counted as what they are."""
        share = queue.allocated.dominant_share(self.total)
        if queue.shared_gpu and self.total.gpu:
            gpu = (queue.allocated.gpu + queue.shared_gpu / sharing.MILLI) / self.total.gpu
            share = max(share, gpu)
        return share

    # --- placement ---------------------------------------------------------------------

    def accepts(self, job: JobInfo, task: TaskInfo, node: NodeView, fits: Fits | None) -> bool:
        """May the task go on the node now?"""
        request = task.resources
        return (
            (
                len(node.free_devices) >= request.gpu
                if not task.gpu_share
                else sharing.fits(node, task)
            )
            and node.name not in self.nominated
            and request.cpu <= node.free_cpu
            and request.memory <= node.free_memory
            and (
                not self.placing_predicates
                or all(p.predicate(self, job, task, node) is None for p in self.placing_predicates)
            )
            and (fits is None or fits(node, task))
        )

    def eligible_nodes(self, job: JobInfo, task: TaskInfo) -> list[NodeView]:
        """Nodes that could ever take the task (resources aside from capacity), in snapshot
        order. Cached per task shape, as predicates depend on the task and node only."""
        shape = task_shape(task)
        nodes = self._eligible.get(shape)
        if nodes is None:
            positions = self._static_reasons(job, task)[1]
            nodes = self._eligible[shape] = [self.nodes[p] for p in positions]
        return nodes

    def eligible_names(self, job: JobInfo, task: TaskInfo) -> list[str]:
        """The names of `eligible_nodes`."""
        shape = task_shape(task)
        names = self._eligible_names.get(shape)
        if names is None:
            names = self._eligible_names[shape] = [n.name for n in self.eligible_nodes(job, task)]
        return names

    def _static_reasons(
        self, job: JobInfo, task: TaskInfo
    ) -> tuple[tuple[Counter[str], dict[str, int]], list[int]]:
        """For the task's shape: how many nodes can never take it, per reason, with the
        position of the first node giving each; and the positions of `eligible_nodes`."""
        shape = task_shape(task)
        known = self._static.get(shape)
        if known is None:
            reasons = self._reasons_by_kind(job, task)
            tallied: Counter[str | None] = Counter(reasons)  # (in the order each first occurs)
            tallied.pop(None, None)
            counts = cast(Counter[str], tallied)
            first = {reason: reasons.index(reason) for reason in counts}
            positions = list(compress(range(len(reasons)), map(is_, reasons, repeat(None))))
            known = self._static[shape] = ((counts, first), positions)
        return known

    def _reasons_by_kind(self, job: JobInfo, task: TaskInfo) -> list[str | None]:
        """`node_reason` for the task of each node, in position order: asked once per kind
        of node (state, labels, capacity and GPU sharing, all it depends on when every
        predicate only says what the index does: `Plugin.implied_by_index`), of the first
        node of the kind; else once per node."""
        if self.placing_predicates:
            return [self.node_reason(job, task, node) for node in self.nodes]
        known = self._node_kinds
        if known is None:
            numbers: dict[tuple[object, ...], int] = {}
            kinds: list[int] = []
            firsts: list[NodeView] = []
            for node in self.nodes:
                kind = (
                    node.state,
                    node.label_key,
                    node.allocatable,
                    node.healthy_devices,
                    node.sharing,
                    max(node.device_memory.values(), default=0),
                    node.mig_profiles,
                )
                number = numbers.get(kind)
                if number is None:
                    number = numbers[kind] = len(firsts)
                    firsts.append(node)
                kinds.append(number)
            known = self._node_kinds = (kinds, firsts)
        # (Kinds by number: no kind is hashed again per node.)
        by_kind = [self.node_reason(job, task, node) for node in known[1]]
        return list(map(by_kind.__getitem__, known[0]))

    def node_reason(self, job: JobInfo, task: TaskInfo, node: NodeView) -> str | None:
        """Why the node can never take this task as it stands (None: only resources)."""
        if not node.ready:
            return f"node {_state_word(node.state)}"
        if any(node.labels.get(k) != v for k, v in task.node_selector.items()):
            return "node selector mismatch"
        if task.gpu_share and (never := sharing.never_reason(node, task)) is not None:
            return never
        problem = self.predicate(job, task, node)
        if problem is not None:
            return problem
        short = task.resources.short_of(node.capacity())
        if short:
            return f"insufficient {short[0]}"
        return None

    def explain(self, job: JobInfo, task: TaskInfo) -> tuple[str, bool, dict[str, int]]:
        """`0/12 nodes fit: 8 insufficient gpu, 4 node selector mismatch`, whether the task
        could fit on some node once resources are freed, and the count per node reason. A
        session that does not explain gives only the second."""
        eligible = self.eligible_nodes(job, task)
        if not self.explain_failures:
            return "", bool(eligible), {}
        # The reasons that never change are counted once per shape; only the nodes that
        # could take the task are looked at, each reason where it first occurs.
        static, positions = self._static_reasons(job, task)
        first = dict(static[1])
        counts: Counter[str] = Counter(static[0])
        if task.gpu_share:
            seen, seen_first = self._node_reasons(task, eligible, positions)
        else:
            nominated = self._nominated_marks(eligible, positions)
            shorts = self._shortfalls(eligible, task.resources)
            seen, seen_first = _short_of(shorts, eligible, positions, nominated)
        for reason, position in seen_first.items():
            known = first.get(reason)
            if known is None or position < known:  # (a static reason may come later)
                first[reason] = position
            counts[reason] += seen[reason]
        counts = Counter({r: counts[r] for r in sorted(counts, key=first.__getitem__)})
        could_fit = bool(eligible)
        parts = ", ".join(
            f"{n} {r}" for r, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))
        )
        detail = f"0/{len(self.nodes)} nodes fit: {parts}" if parts else "no nodes"
        return detail, could_fit, dict(counts)

    def _shortfalls(self, eligible: list[NodeView], request: Resources) -> tuple[int, ...]:
        """`_marks` of whether each of `eligible` has less cpu free than `request` asks,
        less memory, fewer whole devices. Kept per list and figure, and brought up to date
        by asking again only the nodes whose free resources changed since (`changed`), or
        every node where that is a third of them or more (asking a list at once costs about
        a third of asking its nodes one by one): an `explain` of a shape asked before looks
        at the few nodes placements touched in between, not at every eligible node."""
        eligible = self._same_nodes(eligible)
        end = len(self.changed)
        most = len(eligible) // 3 + 8
        marks = []
        for dimension, need in enumerate(request):
            key = (id(eligible), dimension, need)
            kept = self._shorts.get(key)
            free = _FREE_OF[dimension]
            if kept is None or kept[0] is not eligible or end - kept[2][0] > most:
                answers = bytearray(map(lt, _ALL_FREE[dimension](eligible), repeat(need)))
                kept = self._shorts[key] = (eligible, answers, [end])
            elif kept[2][0] < end:
                answers, at = kept[1], self._index_of(eligible)
                for node in self.changed[kept[2][0] : end]:
                    i = at.get(node)
                    if i is not None:
                        answers[i] = free(node) < need
                kept[2][0] = end
            marks.append(int.from_bytes(kept[1], "little"))
        return tuple(marks)

    def _same_nodes(self, eligible: list[NodeView]) -> list[NodeView]:
        """The first list of the same nodes in the same order `_shortfalls` was asked about
        (shapes that differ only in devices have the same eligible nodes, in lists of their
        own: what they have free of cpu and memory is the same answer)."""
        known = self._same.get(id(eligible))
        if known is None or known[0] is not eligible:
            first = self._by_nodes.setdefault(tuple(map(id, eligible)), eligible)
            known = self._same[id(eligible)] = (eligible, first)
        return known[1]

    def _index_of(self, eligible: list[NodeView]) -> dict[NodeView, int]:
        """Each of `eligible`'s place in it (`_shortfalls`), made when first asked."""
        known = self._indices.get(id(eligible))
        if known is None or known[0] is not eligible:
            known = self._indices[id(eligible)] = (eligible, {n: i for i, n in enumerate(eligible)})
        return known[1]

    def _nominated_marks(self, eligible: list[NodeView], positions: list[int]) -> int:
        """`_marks` of whether each of `eligible` (the nodes at `positions`, ascending) is
        nominated for a preempting job: found by position for a few nominated nodes (a
        preemption nominates the nodes of one gang), not by asking each eligible node."""
        nominated = self.nominated
        if not nominated:
            return 0
        if len(nominated) > 64:
            return _marks(map(nominated.__contains__, map(_name, eligible)))
        at = self._node_positions
        if at is None:
            at = self._node_positions = {}
            for position, node in enumerate(self.nodes):
                at.setdefault(node.name, []).append(position)
        marks = 0
        for name in nominated:
            for position in at.get(name, ()):
                i = bisect.bisect_left(positions, position)
                if i < len(positions) and positions[i] == position:
                    marks |= 1 << (i << 3)  # (its byte: one per eligible node)
        return marks

    def _node_reasons(
        self, task: TaskInfo, eligible: list[NodeView], positions: list[int]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Why each of `eligible` (at `positions`) cannot take the task now: how many give
        each reason, and the position of the first to give it (nodes are looked at in
        position order: the first time a reason is seen is its first)."""
        seen: dict[str, int] = {}
        seen_first: dict[str, int] = {}
        nominated = self.nominated
        cpu, memory, gpu = task.resources
        for node, position in zip(eligible, positions, strict=True):
            if node.name in nominated:
                reason = "reserved for a preempting job"
            elif cpu > node.free_cpu:
                reason = "insufficient cpu"
            elif memory > node.free_memory:
                reason = "insufficient memory"
            elif (
                gpu > len(node.free_devices)
                if not task.gpu_share
                else not sharing.options(node, task)
            ):
                reason = "insufficient gpu"
            else:
                reason = "held for the reservation"
            count = seen.get(reason)
            if count is None:
                seen[reason] = 1
                seen_first[reason] = position
            else:
                seen[reason] = count + 1
        return seen, seen_first

    def status_of(self, failure: Failure) -> Status:
        """The failure's status: made once for a refusal kept in `refusals` (statuses are
        never changed once set, so jobs refused alike share it), else made now."""
        status = self.refusal_statuses.get(id(failure))
        return failure.status() if status is None else status

    def set_pending(self, job: JobInfo, info: Status) -> None:
        self.pending[job.id] = info

    def own_statuses(self) -> None:
        """Every job still waiting behind `blocked` gets a status of its own (statuses are
        changed afterwards: `scheduler.cycle.planning` sets each one's estimated start)."""
        shared = self.behind_blocked
        if shared is None:
            return
        self.behind_blocked = None
        pending = self.pending
        for job_id in [i for i, status in pending.items() if status is shared]:
            pending[job_id] = Status(shared.code, shared.message)


class NodeScan:
    """Finds a node for each of one job's tasks in turn, in the session's node order.

    For consecutive alike tasks without devices the scan resumes at the node the last task
    took, instead of starting over: placing such a task only shrinks what is free and moves
    no node in the index, so every node the scan passed still cannot take the next one.
    (With an order that looks at free cpu, e.g. spread, every task starts over.)
    """

    def __init__(self, session: Session, job: JobInfo, fits: Fits | None = None) -> None:
        self.session = session
        self.job = job
        self.fits = fits
        self._scan: Iterator[NodeView] | None = None
        self._last_task: TaskInfo | None = None
        self._last_node: NodeView | None = None

    def find(self, task: TaskInfo) -> NodeView | None:
        session, job, fits = self.session, self.job, self.fits
        last = self._last_task
        if (
            self._scan is not None
            and last is not None
            and task.resources.gpu == 0
            and session.static_node_order
            and task.resources == last.resources
            and task.node_selector == last.node_selector
        ):
            scan = self._scan
            node = self._last_node
            if node is not None and session.accepts(job, task, node, fits):
                self._last_task = task
                return node
        else:
            # Nodes without the cpu or memory free are passed over before `accepts` (which
            # would refuse them the same); without devices anywhere, nothing ever moves in
            # the index and the order is kept as a list.
            cpu, memory = task.resources.cpu, task.resources.memory
            order: Iterable[NodeView] = (
                session.ordered_nodes(task)
                if session.max_devices == 0 and session.static_node_order
                else session.candidate_nodes(task)
            )
            if task.resources.gpu and not task.gpu_share:
                return self._first_with_devices(task, order)
            scan = (n for n in order if n.free_cpu >= cpu and n.free_memory >= memory)
        if task.gpu_share:  # a fraction: the node the placement policy scores best
            self._scan = None
            takers = [n for n in scan if session.accepts(job, task, n, None)]
            # `fits` (backfill's spare) is asked of the chosen node only: it keeps count.
            for node in sharing.ranked(session.gpu_policy, takers, task):
                if fits is None or fits(node, task):
                    return node
            return None
        self._scan, self._last_task, self._last_node = scan, task, None
        for node in scan:
            if session.accepts(job, task, node, fits):
                self._last_node = node
                return node
        return None

    def _first_with_devices(self, task: TaskInfo, order: Iterable[NodeView]) -> NodeView | None:
        """`find` for a task asking whole devices: the first node in `order` that
        `accepts` it, its tests spelled out. Such a scan is never resumed (a task resumes
        only the scan of an alike task without devices), so none is kept."""
        session, job, fits = self.session, self.job, self.fits
        self._scan, self._last_task, self._last_node = None, task, None
        predicates = session.placing_predicates

        def accept(node: NodeView) -> bool:
            return all(p.predicate(session, job, task, node) is None for p in predicates) and (
                fits is None or fits(node, task)
            )

        test = accept if predicates or fits is not None else None
        taker = first_taker(order, task.resources, session.nominated, test)
        self._last_node = taker
        return taker


def first_taker(
    order: Iterable[NodeView],
    request: Resources,
    nominated: Container[str],
    accept: Callable[[NodeView], bool] | None,
) -> NodeView | None:
    """The first node in `order` with room for `request` (its GPUs as whole free devices),
    not nominated for a preemptor, that `accept` (None: any) takes."""
    cpu, memory, gpu = request
    for node in order:
        if (
            node.free_cpu >= cpu
            and node.free_memory >= memory
            and len(node.free_devices) >= gpu
            and node.name not in nominated
            and (accept is None or accept(node))
        ):
            return node
    return None


_name = attrgetter("name")
_job_id = attrgetter("id")
_free_cpu = attrgetter("free_cpu")
_free_memory = attrgetter("free_memory")
_free_devices = attrgetter("free_devices")


def _free_device_count(node: NodeView) -> int:
    return len(node.free_devices)


# What a node has free of each dimension of a request, of one node and of a list of them
# (without a Python call per node), and the reason it gives if too little.
_FREE_OF: tuple[Callable[[NodeView], int], ...] = (_free_cpu, _free_memory, _free_device_count)
_ALL_FREE: tuple[Callable[[list[NodeView]], Iterator[int]], ...] = (
    lambda nodes: map(_free_cpu, nodes),
    lambda nodes: map(_free_memory, nodes),
    lambda nodes: map(len, map(_free_devices, nodes)),
)
_SHORT_OF = ("insufficient cpu", "insufficient memory", "insufficient gpu")


def _short_of(
    shorts: tuple[int, ...], eligible: list[NodeView], positions: list[int], nominated: int
) -> tuple[dict[str, int], dict[str, int]]:
    """`Session._node_reasons` for a task asking whole devices, in whole-list passes rather
    than a test per node: a node is nominated for a preempting job (`nominated`: the
    `_marks` of which are, `Session._nominated_marks`), else short of cpu, else of memory,
    else of devices (`shorts`: the `_marks` of which are, `Session._shortfalls`), else it
    is held for the reservation.

    Each test's answers are one byte per node (1: it gives the reason) read as one integer,
    so combining them, counting and finding the first are integer operations."""
    before = nominated
    everyone = int.from_bytes(b"\x01" * len(eligible), "little")
    seen: dict[str, int] = {}
    seen_first: dict[str, int] = {}

    def count(reason: str, marks: int) -> None:
        if marks:
            seen[reason] = marks.bit_count()
            seen_first[reason] = positions[((marks & -marks).bit_length() - 1) >> 3]

    count("reserved for a preempting job", before)
    for reason, short in zip(_SHORT_OF, shorts, strict=True):
        count(reason, short & ~before)  # short, and no reason before
        before |= short
    count("held for the reservation", everyone & ~before)
    return seen, seen_first


def sorted_by_first(keys: list[tuple[Any, ...]]) -> list[int]:
    """`sorted(range(len(keys)), key=keys.__getitem__)` for keys of ints and floats whose
    NaNs come first in them (`Plugin.numbers_first_nan`): sorted by their first items
    alone (one number against another, not a tuple against another), then each run of
    equal first items sorted by the whole keys. Where no first item is NaN, the keys are
    ordered wholly (no two both less than each other), so both sorts, stable, give the one
    order there is; with a NaN, by the whole keys."""
    at = keys.__getitem__
    firsts = list(map(_first, keys))
    if any(map(ne, firsts, firsts)):  # (NaN is the one number unequal to itself)
        return sorted(range(len(keys)), key=at)
    order = sorted(range(len(keys)), key=firsts.__getitem__)
    ordered = list(map(firsts.__getitem__, order))
    # Where the first items of two neighbours are equal: each run of such, sorted whole.
    ties = list(compress(range(len(ordered)), map(eq, ordered, islice(ordered, 1, None))))
    i, end = 0, len(ties)
    while i < end:
        start = last = ties[i]
        i += 1
        while i < end and ties[i] == last + 1:
            last = ties[i]
            i += 1
        order[start : last + 2] = sorted(order[start : last + 2], key=at)
    return order


_first = itemgetter(0)


def _marks(answers: Iterable[bool]) -> int:
    """The answers as an integer, one byte each, the first lowest: 1 for True, 0 for False."""
    return int.from_bytes(bytes(answers), "little")


def task_shape(task: TaskInfo) -> Shape:
    selector = task.node_selector
    fraction = (
        (task.gpu_share, task.gpu_memory, task.gpu_modes, task.gpu_mig) if task.gpu_share else ()
    )
    return (
        task.resources,
        tuple(sorted(selector.items())) if selector else (),  # `selector_key`
        fraction,
    )


def pending_shape(tasks: list[TaskInfo]) -> Shape | None:
    """The `task_shape` of a job's pending `tasks` if there are some and all are alike
    (`alike`, spelled out: once per task of the backlog), else None."""
    if not tasks:
        return None
    first = tasks[0]
    resources, selector, share = first.resources, first.node_selector, first.gpu_share
    if len(tasks) > 1:
        memory, modes, mig = first.gpu_memory, first.gpu_modes, first.gpu_mig
        for task in tasks:
            if (
                task.resources != resources
                or task.node_selector != selector
                or task.gpu_share != share
                or task.gpu_memory != memory
                or task.gpu_modes != modes
                or task.gpu_mig != mig
            ):
                return None
    return (  # (`task_shape`, spelled out)
        resources,
        tuple(sorted(selector.items())) if selector else (),
        (share, first.gpu_memory, first.gpu_modes, first.gpu_mig) if share else (),
    )


def alike(a: TaskInfo, b: TaskInfo) -> bool:
    """Do the two tasks ask for the same, on the same nodes?"""
    return (
        a.resources == b.resources
        and a.node_selector == b.node_selector
        and a.gpu_share == b.gpu_share
        and a.gpu_memory == b.gpu_memory
        and a.gpu_modes == b.gpu_modes
        and a.gpu_mig == b.gpu_mig
    )


def whole_devices(task: TaskInfo) -> int:
    """The whole devices a task holds (a fraction holds none whole)."""
    return 0 if task.gpu_share else len(task.devices)


def held_resources(task: TaskInfo) -> Resources:
    """What a placed task holds, in whole devices (a fraction's share is counted apart)."""
    if task.gpu_share:
        return Resources(task.resources.cpu, task.resources.memory, 0)
    return task.resources


def _load_tasks(
    jobs: Iterable[JobInfo], node_of: Callable[[str], NodeView | None], now: float, correction: str
) -> tuple[list[End], list[tuple[JobInfo, TaskInfo, str]], set[str], int, dict[str, list[int]]]:
    """`Session._load_running`'s pass over the tasks, which also returns what each queue's
    jobs hold (queue -> cpu, memory, whole devices, fractions in thousandths)."""
    ends: list[End] = []
    fraction_ends: list[tuple[JobInfo, TaskInfo, str]] = []
    fractions: set[str] = set()
    releasing = 0
    held: dict[str, list[int]] = {}
    for job in jobs:
        counted = held.get(job.queue) or held.setdefault(job.queue, [0, 0, 0, 0])
        stopping, walltime, predicted = job.suspend_requested, job.walltime, job.predicted
        for task in job.tasks:
            state = task.state
            if state not in HOLDS_RESOURCES or task.node is None:
                continue
            node = node_of(task.node)
            if node is None:
                continue
            cpu, memory, gpu = request = task.resources
            node.free_cpu -= cpu
            node.free_memory -= memory
            devices, share = task.devices, task.gpu_share
            if devices:
                _hold_devices(node, task)
            if state == "Releasing" or stopping:
                node.rel_cpu += cpu
                node.rel_memory += memory
                node.rel_devices += 0 if share else len(devices)  # (`whole_devices`)
            node.tasks.append((job, task))
            counted[0] += cpu  # (`held_resources`, spelled out; a fraction in thousandths)
            counted[1] += memory
            counted[3 if share else 2] += share or gpu
            if share and not task.gpu_mig:
                fractions.add(node.name)
            if state == "Releasing":
                releasing += 1
            elif walltime is None or task.started_at is None:
                pass  # (no end planned)
            elif share:
                fraction_ends.append((job, task, node.name))
            else:  # (`end_entries`, spelled out for a task holding whole devices or none)
                at = (task.started_at + walltime if predicted is None
                      else predict.end(job, task.started_at, now, correction) or 0.0)  # fmt: skip
                release = request if gpu == len(devices) else Resources(cpu, memory, len(devices))
                ends.append((at, node.name, task.id, job.id, release))
    return ends, fraction_ends, fractions, releasing, held


def _hold_devices(node: NodeView, task: TaskInfo) -> None:
    """A placed task's devices leave the node's free ones; a fraction takes its share."""
    free = node.free_devices
    if not task.gpu_mig and not task.gpu_share:  # (whole devices: the most, looked at once)
        for d in task.devices:
            if d in free:
                free.remove(d)
        return
    for d in task.devices:
        if task.gpu_mig:
            sharing.take(node, task, d, task.gpu_instance)
        elif d in node.shared or d in free:
            sharing.take(node, task, d)


def selector_key(selector: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The selector as a sorted tuple (most have none: no sort then)."""
    return tuple(sorted(selector.items())) if selector else ()


def grows(job: JobInfo) -> bool:
    """A running job with pending tasks left that may still be placed."""
    return (
        job.state == "Running"
        and not job.suspend_requested
        and any(t.state == "Pending" for t in job.tasks)
        and not any(t.state == "Releasing" for t in job.tasks)
    )


def request_floor(pending: Iterable[list[TaskInfo]]) -> tuple[int, int]:
    """The least cpu and the least memory (each on its own) any of the `pending` tasks
    asks (the candidates' pending tasks); (0, 0) with none."""
    cpu = memory = -1
    for tasks in pending:
        for task in tasks:
            request = task.resources
            if cpu < 0 or request.cpu < cpu:
                cpu = request.cpu
            if memory < 0 or request.memory < memory:
                memory = request.memory
    return (max(cpu, 0), max(memory, 0))


def _sort_out(
    jobs: list[JobInfo],
) -> tuple[list[JobInfo], dict[int, int], list[JobInfo], dict[int, list[TaskInfo]], list[JobInfo]]:
    """The candidates (in snapshot order) with how many tasks each needs at once
    (`need_of`), the running jobs, each candidate's pending tasks (`pending_tasks`), and
    the jobs that may hold something (all but candidates with no task holding anything):
    one pass over a backlog of any size."""
    candidates: list[JobInfo] = []
    need: dict[int, int] = {}
    running: list[JobInfo] = []
    pending: dict[int, list[TaskInfo]] = {}
    holders: list[JobInfo] = []
    for job in jobs:
        state = job.state
        if state == "Running":
            running.append(job)
            # (`grows`, spelled out: a task left to place, none being released)
            left = False
            for task in job.tasks:
                if task.state == "Pending":
                    left = True
                elif task.state == "Releasing":
                    left = False
                    break
            if not left or job.suspend_requested:
                holders.append(job)
                continue
        elif job.suspend_requested or (state != "Pending" and state != "Suspended"):
            holders.append(job)  # (not `is_candidate`, spelled out; nor `grows`: not Running)
            continue
        candidates.append(job)
        held = 0
        holds = False
        waiting = []
        for task in job.tasks:
            state = task.state
            if state == "Pending":
                waiting.append(task)
            elif state in HOLDS_RESOURCES:
                holds = True
                if task.node and state != "Releasing":  # (Assigned or Running)
                    held += 1
        more = job.min_available - held
        need[job.id] = more if more > 0 else 0  # `need_of`
        pending[job.id] = waiting
        if holds:
            holders.append(job)
    return candidates, need, running, pending, holders


_cpu_of, _memory_of, _gpu_of = itemgetter(0), itemgetter(1), itemgetter(2)  # (of Resources)
_end_of, _node_of, _task_of = itemgetter(0), itemgetter(1), itemgetter(2)  # (of an `End`)
_healthy_devices_of, _allocatable_of = attrgetter("healthy_devices"), attrgetter("allocatable")


def sort_ends(ends: list[End]) -> None:
    """Sort planned ends in place into the order `ends.sort()` gives them, faster where
    many are equal (tasks started together with one walltime: most of a busy cluster's), whose
    comparisons go on to the node names and task ids through the tuples' slow path. There
    they are sorted by task id, then by node, then by end, each a stable sort on one field
    whose keys compare as ints, strings or floats alone.

    The same order as long as no two entries share a task id (where they would go on to their
    job ids and resources) and no end is NaN (which compares with nothing): otherwise, and
    where few ends are equal (in an even sample of them), it is the plain sort."""
    if (
        not many_equal(ends)
        or len(set(map(_task_of, ends))) != len(ends)
        or math.isnan(sum(map(_end_of, ends)))
    ):
        ends.sort()
        return
    ends.sort(key=_task_of)
    ends.sort(key=_node_of)
    ends.sort(key=_end_of)


def many_equal(ends: list[End]) -> bool:
    """Are many of the ends equal: in an even sample of about 256 of them, at least a
    quarter equal to another of the sample? (Where few are, sorting the tuples rarely goes
    past the ends, and `sort_ends`'s three sorts would cost more than the one.)"""
    sample = list(map(_end_of, ends[:: len(ends) // 256 + 1]))
    return (len(sample) - len(set(sample))) * 4 >= len(sample) > 0


def need_of(job: JobInfo) -> int:
    """How many pending tasks must be placed at once: the gang minus what already runs."""
    held = 0
    for task in job.tasks:
        if task.node and task.state in ("Assigned", "Running"):
            held += 1
    return max(0, job.min_available - held)


def _state_word(state: str) -> str:
    return {"NotReady": "not ready", "DiskPressure": "disk full"}.get(state, state.lower())
