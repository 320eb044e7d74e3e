"""The statement: binds and evictions made for one job, applied to the session as they are
made, then kept together by `commit()` or undone together by `discard()` (as Volcano's
statement does for allocate, pipeline and evict)."""

from __future__ import annotations

from scheduler.core import sharing
from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.resources import Resources, tuple_new
from scheduler.core.session import Session, held_resources, whole_devices
from scheduler.core.types import Bind, Evict, NodeView, _new_object, _set_attribute

EVICTED_STATES = ("Assigned", "Running")  # what an evicted job's tasks give back


class Statement:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.allocations: list[tuple[JobInfo, TaskInfo, NodeView, tuple[int, ...]]] = []
        self.evictions: list[tuple[JobInfo, Evict]] = []

    # --- binds -----------------------------------------------------------------------

    def allocate(self, job: JobInfo, task: TaskInfo, node: NodeView) -> tuple[int, ...]:
        request = task.resources
        if task.gpu_share:
            return self._allocate_fraction(job, task, node)
        devices = _pick_devices(node.free_devices, request.gpu) if request.gpu > 0 else ()
        old_free = len(node.free_devices)
        node.free_cpu -= request.cpu
        node.free_memory -= request.memory
        if devices:
            chosen = set(devices)
            node.free_devices = [d for d in node.free_devices if d not in chosen]
            self.session.move_in_index(node, old_free)
            self.session.freed(node, -request.cpu, -request.memory, -len(devices), moved=True)
        else:
            self.session.freed(node, -request.cpu, -request.memory, 0)
        self.allocations.append((job, task, node, devices))
        return devices

    def _allocate_fraction(self, job: JobInfo, task: TaskInfo, node: NodeView) -> tuple[int, ...]:
        """A fraction of one device: the device the placement policy picks on the node."""
        device = sharing.pick_device(self.session.gpu_policy, node, task)
        old_free = len(node.free_devices)
        node.free_cpu -= task.resources.cpu
        node.free_memory -= task.resources.memory
        opened = sharing.take(node, task, device)
        if opened:
            self.session.move_in_index(node, old_free)
        self.session.freed(node, -task.resources.cpu, -task.resources.memory, -int(opened))
        self.allocations.append((job, task, node, (device,)))
        return (device,)

    def allocate_alike(
        self, job: JobInfo, tasks: list[TaskInfo], taking: list[tuple[NodeView, int]]
    ) -> None:
        """`allocate` for alike tasks without devices on ready nodes: the first of `tasks`
        to each node in `taking` as many as it says, in order."""
        request = tasks[0].resources
        allocations = self.allocations
        i = total_cpu = total_memory = 0
        for node, count in taking:
            cpu, memory = request.cpu * count, request.memory * count
            node.free_cpu -= cpu
            node.free_memory -= memory
            total_cpu, total_memory = total_cpu + cpu, total_memory + memory
            if count == 1:
                allocations.append((job, tasks[i], node, ()))
            else:
                allocations.extend([(job, task, node, ()) for task in tasks[i : i + count]])
            i += count
        self.session.took([node for node, _count in taking], total_cpu, total_memory)

    # --- evictions -------------------------------------------------------------------

    def evict(self, victim: JobInfo, reason: str, preemptor: JobInfo) -> None:
        """The victim's running tasks count as releasing and its queue no longer holds
        them, from now on in this session."""
        session = self.session
        message = (
            f"{reason.lower()} by job {preemptor.id} ({preemptor.name},"
            f" priority {preemptor.priority})"
        )
        session.evicted.add(victim.id)
        self._release(victim, +1)
        self.evictions.append((victim, Evict(victim.id, reason, preemptor.id, message)))

    def _release(self, victim: JobInfo, sign: int) -> None:
        session = self.session
        held = Resources()
        shared = 0
        for task in victim.tasks:
            if task.state not in EVICTED_STATES:
                continue
            held = held + held_resources(task)
            shared += task.gpu_share
            node = session.node_by_name.get(task.node or "")
            if node is not None:
                node.rel_cpu += sign * task.resources.cpu
                node.rel_memory += sign * task.resources.memory
                node.rel_devices += sign * whole_devices(task)
        queue = session.queues.get(victim.queue)
        if queue is not None:
            queue.allocated = queue.allocated - held if sign > 0 else queue.allocated + held
            queue.shared_gpu -= sign * shared

    # --- the outcome -----------------------------------------------------------------

    def discard(self) -> None:
        """Undo every bind and eviction made through this statement, last first."""
        for _job, task, node, devices in reversed(self.allocations):
            old_free = len(node.free_devices)
            node.free_cpu += task.resources.cpu
            node.free_memory += task.resources.memory
            if task.gpu_share:
                whole = sharing.give_back(node, task, devices[0])
                if whole:
                    self.session.move_in_index(node, old_free)
                self.session.freed(node, task.resources.cpu, task.resources.memory, int(whole))
                continue
            if devices:
                node.free_devices = sorted(node.free_devices + list(devices))
                self.session.move_in_index(node, old_free)
            self.session.freed(node, task.resources.cpu, task.resources.memory, len(devices))
        for victim, _evict in reversed(self.evictions):
            self._release(victim, -1)
            self.session.evicted.discard(victim.id)
        self.allocations.clear()
        self.evictions.clear()

    def commit(self, action: str) -> list[Bind]:
        """Record the binds and evictions as the cycle's decisions."""
        session = self.session
        allocations = self.allocations
        if allocations or self.evictions:
            session.version += 1
        if self.evictions:
            session.evictions.extend(evict for _victim, evict in self.evictions)
        binds = self._record_binds(action) if allocations else []
        self.allocations.clear()
        self.evictions.clear()
        return binds

    def _record_binds(self, action: str) -> list[Bind]:
        """The statement's allocations (one job's) as binds, and what its queue now holds."""
        session, allocations = self.session, self.allocations
        binds: list[Bind] = []
        # One pass: each bind (`_bind`) and what the job now holds (`held_resources`).
        add = binds.append
        cpu = memory = gpu = shared = 0
        for job, task, node, devices in allocations:
            add(_bind(job, task, node, devices, action))
            request = task.resources
            cpu, memory = cpu + request.cpu, memory + request.memory
            if task.gpu_share:
                shared += task.gpu_share  # a fraction holds no device whole
                if not task.gpu_mig:  # a MIG instance is its own; no device is shared
                    session.pin_shared(node, devices[0])
            else:
                gpu += request.gpu
        session.binds.extend(binds)
        session.bound.extend(allocations)
        job = allocations[0][0]  # a statement is one job's
        queue = session.queues.get(job.queue)
        if queue is not None:
            held_now = queue.allocated  # `+` spelled out: once per job a cycle starts
            queue.allocated = tuple_new(
                Resources,
                (held_now.cpu + cpu, held_now.memory + memory, held_now.gpu + gpu),
            )
            queue.shared_gpu += shared
        session.placed.add(job.id)
        session.pending.pop(job.id, None)
        return binds


def _bind(job: JobInfo, task: TaskInfo, node: NodeView, devices: tuple[int, ...],
          action: str) -> Bind:  # fmt: skip
    """`new_bind` with `sharing.instance_of`, spelled out: once per task a cycle starts."""
    held = node.mig_held.get(task.id) if node.mig_held else None
    bind = _new_object(Bind)
    _set_attribute(
        bind,
        "__dict__",
        {
            "job_id": job.id,
            "task_id": task.id,
            "node": node.name,
            "devices": devices,
            "action": action,
            "instance": held[1] if held else "",
        },  # fmt: skip
    )
    return bind


def commit_one(
    session: Session,
    job: JobInfo,
    task: TaskInfo,
    node: NodeView,
    action: str,
    resources: Resources | None = None,
) -> Bind:
    """`Statement.allocate` then `commit` for a job's one task asking whole devices or
    none, on a ready node: the same changes, without a statement. (`resources`: equal to
    the task's, where the caller has them at hand.)"""
    cpu, memory, gpu = task.resources if resources is None else resources
    node.free_cpu -= cpu
    node.free_memory -= memory
    if gpu > 0:
        devices = _pick_devices(node.free_devices, gpu)
        old_free = len(node.free_devices)
        chosen = set(devices)
        node.free_devices = [d for d in node.free_devices if d not in chosen]
        session.move_in_index(node, old_free)
        session.freed(node, -cpu, -memory, -len(devices), moved=True)
    else:
        devices = ()
        session.freed(node, -cpu, -memory, 0)
    session.version += 1
    bind = _bind(job, task, node, devices, action)
    session.binds.append(bind)
    session.bound.append((job, task, node, devices))
    queue = session.queues.get(job.queue)
    if queue is not None:
        held_now = queue.allocated  # (a new tuple, as `_record_binds` makes)
        queue.allocated = tuple_new(
            Resources, (held_now.cpu + cpu, held_now.memory + memory, held_now.gpu + gpu)
        )
    session.placed.add(job.id)
    session.pending.pop(job.id, None)
    return bind


def _pick_devices(free: list[int], count: int) -> tuple[int, ...]:
    """The lowest free device indices, preferring a contiguous run (kept sorted)."""
    if count <= 0:
        return ()
    for start in range(len(free) - count + 1):
        window = free[start : start + count]
        if window[-1] - window[0] == count - 1:
            return tuple(window)
    return tuple(free[:count])
