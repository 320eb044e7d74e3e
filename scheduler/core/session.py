"""A session over one snapshot: the mutable view actions work on, and the statement.

Nodes that can take tasks are indexed by label set and by free-device count, so finding a node
for a task looks at a few candidates instead of every node. Actions never call plugins
directly: they call the session's combined functions (`job_key`, `queue_key`, `predicate`,
`job_ready`, `preemptable`, `reclaimable`, `overused`, `candidate_nodes`), which ask every
registered plugin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.core.model import JobInfo, QueueInfo, SchedulerConfig, Snapshot, TaskInfo
from scheduler.core.resources import DIMENSIONS, Resources
from scheduler.core.status import Code, Status

if TYPE_CHECKING:
    from scheduler.core.plugins import Plugin

ON_NODE = ("Assigned", "Running", "Releasing")


class NodeState:
    """A node as the session sees it: what is free now and what is being released."""

    __slots__ = (
        "name", "labels", "state", "allocatable", "free_cpu", "free_memory", "free_devices",
        "rel_cpu", "rel_memory", "rel_devices", "label_key", "tasks", "healthy_devices",
    )  # fmt: skip

    def __init__(self, info: Any) -> None:
        self.name: str = info.name
        self.labels: dict[str, str] = info.labels
        self.state: str = info.state
        self.allocatable: Resources = info.allocatable
        healthy = sorted(d.index for d in info.devices if d.healthy)
        self.healthy_devices = len(healthy)
        self.free_cpu = info.allocatable.cpu
        self.free_memory = info.allocatable.memory
        self.free_devices: list[int] = healthy
        self.rel_cpu = 0
        self.rel_memory = 0
        self.rel_devices = 0
        self.label_key = tuple(sorted(self.labels.items()))
        self.tasks: list[tuple[JobInfo, TaskInfo]] = []

    @property
    def ready(self) -> bool:
        return self.state == "Ready"

    def fits_now(self, request: Resources) -> bool:
        return (
            request.cpu <= self.free_cpu
            and request.memory <= self.free_memory
            and request.gpu <= len(self.free_devices)
        )

    def free(self) -> Resources:
        return Resources(self.free_cpu, self.free_memory, len(self.free_devices))

    def releasing(self) -> Resources:
        return Resources(self.rel_cpu, self.rel_memory, self.rel_devices)

    def capacity(self) -> Resources:
        return Resources(self.allocatable.cpu, self.allocatable.memory, self.healthy_devices)


class _LabelGroup:
    """Ready nodes with one label set, bucketed by how many devices they have free."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.buckets: dict[int, dict[str, NodeState]] = {}

    def add(self, node: NodeState) -> None:
        self.buckets.setdefault(len(node.free_devices), {})[node.name] = node

    def move(self, node: NodeState, old_free: int) -> None:
        del self.buckets[old_free][node.name]
        self.add(node)


@dataclass(frozen=True)
class Bind:
    job_id: int
    task_id: int
    node: str
    devices: tuple[int, ...]
    action: str


@dataclass(frozen=True)
class Evict:
    job_id: int
    reason: str  # Preempted | Reclaimed
    preemptor_job_id: int
    message: str


@dataclass
class Failure:
    """Why a job could not be placed, and whether freeing resources could ever help."""

    code: Code
    message: str
    blocked_by_resources: bool
    placeable: int = 0
    detail: str = ""  # the node count explanation alone
    node_reasons: dict[str, int] = field(default_factory=dict)

    def status(self) -> Status:
        return Status(self.code, self.message, dict(self.node_reasons))


@dataclass
class QueueState:
    info: QueueInfo
    allocated: Resources = field(default_factory=Resources)
    jobs: list[JobInfo] = field(default_factory=list)  # admitted candidates, in order


class Session:
    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, plugins: list[Plugin]) -> None:
        self.now = snapshot.now
        self.config = config
        self.plugins = plugins
        self.nodes = [NodeState(n) for n in snapshot.nodes]
        self.node_by_name = {n.name: n for n in self.nodes}
        self.total = Resources()
        for node in self.nodes:
            self.total = self.total + node.capacity()
        self.queues = {q.name: QueueState(q) for q in snapshot.queues}
        self.jobs = {j.id: j for j in snapshot.jobs}
        # A Running job with pending tasks left (a gang started with min_available) is a
        # candidate for the rest, unless it is being stopped.
        self.candidates = [j for j in snapshot.jobs if j.is_candidate or _grows(j)]
        self.need = {j.id: _need(j) for j in self.candidates}
        self.running = [j for j in snapshot.jobs if j.state == "Running"]
        self.pending: dict[int, Status] = {}
        self.binds: list[Bind] = []
        self.evictions: list[Evict] = []
        self.placed: set[int] = set()
        self.evicted: set[int] = set()
        self.pipelined: dict[int, list[str]] = {}  # job -> nodes nominated for it
        self.nominated: set[str] = set()
        self.failures: dict[int, Failure] = {}
        self.blocked: JobInfo | None = None  # first job strict allocate could not start
        self.reservation: Any = None
        self.stats: Counter[str] = Counter()
        self._groups: dict[tuple[tuple[str, str], ...], _LabelGroup] = {}
        self._selector_groups: dict[tuple[tuple[str, str], ...], list[_LabelGroup]] = {}
        self._load_running()
        for node in self.nodes:
            if node.ready:
                key = node.label_key
                if key not in self._groups:
                    self._groups[key] = _LabelGroup(node.labels)
                self._groups[key].add(node)
        self.max_devices = max((n.healthy_devices for n in self.nodes), default=0)
        self._bootstrap_plugins()

    def _load_running(self) -> None:
        for job in self.jobs.values():
            held = Resources()
            for task in job.tasks:
                if task.state not in ON_NODE or task.node is None:
                    continue
                node = self.node_by_name.get(task.node)
                if node is None:
                    continue
                node.free_cpu -= task.resources.cpu
                node.free_memory -= task.resources.memory
                held_devices = [d for d in task.devices if d in node.free_devices]
                for d in held_devices:
                    node.free_devices.remove(d)
                if task.state == "Releasing" or job.suspend_requested:
                    node.rel_cpu += task.resources.cpu
                    node.rel_memory += task.resources.memory
                    node.rel_devices += len(task.devices)
                node.tasks.append((job, task))
                held = held + task.resources
            queue = self.queues.get(job.queue)
            if queue is not None and not held.is_zero():
                queue.allocated = queue.allocated + held

    def _bootstrap_plugins(self) -> None:
        for plugin in self.plugins:
            plugin.open(self)

    # --- combined plugin functions ---------------------------------------------------

    def job_key(self, job: JobInfo) -> tuple[Any, ...]:
        key: tuple[Any, ...] = ()
        for plugin in self.plugins:
            key += plugin.job_key(self, job)
        return key + (job.id,)

    def queue_key(self, queue: QueueState) -> tuple[Any, ...]:
        key: tuple[Any, ...] = ()
        for plugin in self.plugins:
            key += plugin.queue_key(self, queue)
        return key + (queue.info.name,)

    def job_valid(self, job: JobInfo) -> Status | None:
        for plugin in self.plugins:
            problem = plugin.job_valid(self, job)
            if problem is not None:
                return problem
        return None

    def overused(self, queue: QueueState, job: JobInfo) -> Status | None:
        for plugin in self.plugins:
            problem = plugin.overused(self, queue, job)
            if problem is not None:
                return problem
        return None

    def predicate(self, job: JobInfo, task: TaskInfo, node: NodeState) -> str | None:
        """None if the node may run the task (resources aside), else the reason it may not."""
        for plugin in self.plugins:
            problem = plugin.predicate(self, job, task, node)
            if problem is not None:
                return problem
        return None

    def needed(self, job: JobInfo) -> int:
        """Pending tasks that must be placed together for the job to (keep) run(ning)."""
        need = self.need.get(job.id)
        return job.min_available if need is None else need

    def job_ready(self, job: JobInfo, placed: int) -> bool:
        return all(plugin.job_ready(self, job, placed) for plugin in self.plugins)

    def preemptable(self, preemptor: JobInfo, victims: list[JobInfo]) -> list[JobInfo]:
        for plugin in self.plugins:
            victims = plugin.preemptable(self, preemptor, victims)
        return victims

    def reclaimable(self, reclaimer: JobInfo, victims: list[JobInfo]) -> list[JobInfo]:
        for plugin in self.plugins:
            victims = plugin.reclaimable(self, reclaimer, victims)
        return victims

    def candidate_nodes(self, task: TaskInfo) -> Iterator[NodeState]:
        """Ready nodes whose labels match the task's selector, in the preferred order."""
        groups = self._matching_groups(task.node_selector)
        for plugin in self.plugins:
            order = plugin.node_order(self, task, groups)
            if order is not None:
                return order
        return (n for g in groups for b in sorted(g.buckets) for n in list(g.buckets[b].values()))

    def _matching_groups(self, selector: dict[str, str]) -> list[_LabelGroup]:
        key = tuple(sorted(selector.items()))
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
        best = 0.0
        for dim in DIMENSIONS:
            total = getattr(self.total, dim)
            if total:
                best = max(best, getattr(allocated, dim) / total)
        return best

    # --- placement ---------------------------------------------------------------------

    def find_node(
        self,
        job: JobInfo,
        task: TaskInfo,
        fits: Callable[[NodeState, TaskInfo], bool] | None = None,
    ) -> NodeState | None:
        for node in self.candidate_nodes(task):
            if len(node.free_devices) < task.resources.gpu:
                continue
            if node.name in self.nominated:
                continue
            if not node.fits_now(task.resources):
                continue
            if self.predicate(job, task, node) is not None:
                continue
            if fits is not None and not fits(node, task):
                continue
            return node
        return None

    def explain(self, job: JobInfo, task: TaskInfo) -> tuple[str, bool, dict[str, int]]:
        """`0/12 nodes fit: 8 insufficient gpu, 4 node selector mismatch`, whether the task
        could fit on some node once resources are freed, and the count per node reason."""
        counts: Counter[str] = Counter()
        could_fit = False
        for node in self.nodes:
            reason = self._node_reason(job, task, node)
            if reason is None:
                reason = "reserved for a preempting job" if node.name in self.nominated else ""
                if not reason:
                    short = task.resources.short_of(node.free())
                    reason = f"insufficient {short[0]}" if short else "held for the reservation"
                could_fit = True
            counts[reason] += 1
        parts = ", ".join(
            f"{n} {r}" for r, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))
        )
        detail = f"0/{len(self.nodes)} nodes fit: {parts}" if parts else "no nodes"
        return detail, could_fit, dict(counts)

    def _node_reason(self, job: JobInfo, task: TaskInfo, node: NodeState) -> str | None:
        """Why the node can never take this task as it stands (None: only resources)."""
        if not node.ready:
            return f"node {_state_word(node.state)}"
        if any(node.labels.get(k) != v for k, v in task.node_selector.items()):
            return "node selector mismatch"
        problem = self.predicate(job, task, node)
        if problem is not None:
            return problem
        short = task.resources.short_of(node.capacity())
        if short:
            return f"insufficient {short[0]}"
        return None

    def pending_tasks(self, job: JobInfo) -> list[TaskInfo]:
        return [t for t in job.tasks if t.state == "Pending"]

    def set_pending(self, job: JobInfo, info: Status) -> None:
        self.pending[job.id] = info


def _grows(job: JobInfo) -> bool:
    return (
        job.state == "Running"
        and not job.suspend_requested
        and any(t.state == "Pending" for t in job.tasks)
        and not any(t.state == "Releasing" for t in job.tasks)
    )


def _need(job: JobInfo) -> int:
    """How many pending tasks must be placed at once: the gang minus what already runs."""
    held = sum(1 for t in job.tasks if t.state in ("Assigned", "Running") and t.node)
    return max(0, job.min_available - held)


def _state_word(state: str) -> str:
    return {"NotReady": "not ready"}.get(state, state.lower())


class Statement:
    """Allocations made for one job, kept by `commit()` or undone by `discard()`."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.ops: list[tuple[JobInfo, TaskInfo, NodeState, tuple[int, ...]]] = []

    def allocate(self, job: JobInfo, task: TaskInfo, node: NodeState) -> tuple[int, ...]:
        request = task.resources
        devices = _pick_devices(node.free_devices, request.gpu)
        old_free = len(node.free_devices)
        node.free_cpu -= request.cpu
        node.free_memory -= request.memory
        if devices:
            chosen = set(devices)
            node.free_devices = [d for d in node.free_devices if d not in chosen]
        if devices:
            self.session._groups[node.label_key].move(node, old_free)
        self.ops.append((job, task, node, devices))
        return devices

    def discard(self) -> None:
        for _job, task, node, devices in reversed(self.ops):
            old_free = len(node.free_devices)
            node.free_cpu += task.resources.cpu
            node.free_memory += task.resources.memory
            if devices:
                node.free_devices = sorted(node.free_devices + list(devices))
                self.session._groups[node.label_key].move(node, old_free)
        self.ops.clear()

    def commit(self, action: str) -> list[Bind]:
        binds = []
        for job, task, node, devices in self.ops:
            bind = Bind(job.id, task.id, node.name, devices, action)
            binds.append(bind)
            self.session.binds.append(bind)
            queue = self.session.queues.get(job.queue)
            if queue is not None:
                queue.allocated = queue.allocated + task.resources
        if self.ops:
            self.session.placed.add(self.ops[0][0].id)
            self.session.pending.pop(self.ops[0][0].id, None)
        self.ops.clear()
        return binds


def _pick_devices(free: list[int], count: int) -> tuple[int, ...]:
    """The lowest free device indices, preferring a contiguous run (kept sorted)."""
    if count <= 0:
        return ()
    for start in range(len(free) - count + 1):
        window = free[start : start + count]
        if window[-1] - window[0] == count - 1:
            return tuple(window)
    return tuple(free[:count])
