"""The data a session works on and hands back, shared by the session, the plugins and the
actions: the mutable view of a node, the index of ready nodes, a queue's running state, and
the decisions (binds, evictions) and failures a cycle records. Imports only the snapshot
types, so every other module of the core can import it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.model import JobInfo, NodeInfo, QueueInfo, TaskInfo
from scheduler.core.resources import Resources, tuple_new
from scheduler.core.status import Code, Status

# Task states in which a task holds resources on its node (Releasing: asked to stop, holds
# them until the agent confirms). Not `scheduler.states.names.TASK_ON_NODE`, which leaves
# Releasing out.
HOLDS_RESOURCES = ("Assigned", "Running", "Releasing")


class NodeView:
    """A node as the session sees it: what is free now and what is being released."""

    __slots__ = (
        "name", "labels", "state", "allocatable", "free_cpu", "free_memory", "free_devices",
        "rel_cpu", "rel_memory", "rel_devices", "label_key", "tasks", "healthy_devices",
        "sharing", "shared", "shared_memory", "device_memory", "model", "mig_free",
        "mig_profiles", "mig_total", "mig_held",
    )  # fmt: skip

    def __init__(self, info: NodeInfo) -> None:
        self.name: str = info.name
        self.labels: dict[str, str] = info.labels
        self.state: str = info.state
        self.allocatable: Resources = info.allocatable
        self.free_cpu = info.allocatable.cpu
        self.free_memory = info.allocatable.memory
        self.rel_cpu = 0
        self.rel_memory = 0
        self.rel_devices = 0
        labels = self.labels
        self.label_key = tuple(sorted(labels.items())) if labels else ()
        self.tasks: list[tuple[JobInfo, TaskInfo]] = []
        # GPU sharing: the modes offered; each device holding fractions -> its free share
        # (thousandths) and free memory. A device is either in `free_devices` (whole and
        # free), in `shared` (fractions only), or held whole.
        self.sharing: tuple[str, ...] = info.sharing
        self.shared: dict[int, int] = {}
        self.shared_memory: dict[int, int] = {}
        # MIG: the free instances per profile, (GPU index, UUID) in order; every profile the
        # node has (free or not); placed task id -> the (GPU index, UUID) it holds.
        self.mig_free: dict[str, list[tuple[int, str]]] = {}
        self.mig_held: dict[int, tuple[int, str]] = {}
        # A GPU in MIG mode is neither whole nor shareable: only its instances are offered.
        healthy: list[int] = []
        memory: dict[int, int] = {}
        model = ""  # the first device's that names one
        for device in info.devices:  # (one pass over the devices for all of the above)
            if not model and device.model:
                model = device.model
            if device.mig:
                if device.healthy:
                    for instance in device.mig:
                        self.mig_free.setdefault(instance.profile, []).append(
                            (device.index, instance.uuid)
                        )
            else:
                memory[device.index] = device.memory
                if device.healthy:
                    healthy.append(device.index)
        healthy.sort()
        self.free_devices: list[int] = healthy
        self.healthy_devices = len(healthy)
        self.device_memory = memory
        self.model = model
        self.mig_profiles = frozenset(self.mig_free)
        self.mig_total = {p: len(free) for p, free in self.mig_free.items()}

    @property
    def ready(self) -> bool:
        return self.state == "Ready"

    def free(self) -> Resources:
        return tuple_new(Resources, (self.free_cpu, self.free_memory, len(self.free_devices)))

    def releasing(self) -> Resources:
        return Resources(self.rel_cpu, self.rel_memory, self.rel_devices)

    def capacity(self) -> Resources:
        return Resources(self.allocatable.cpu, self.allocatable.memory, self.healthy_devices)


class LabelGroup:
    """Ready nodes with one label set, bucketed by how many devices they have free. A node
    whose free device count changes moves to the end of its new bucket.

    `roomy` holds, per bucket and in the bucket's order, only the nodes with at least
    `floor` (cpu, memory) free: a node left out can take no task asking at least that much,
    so a scan for such a task may pass it by without looking (`scan_buckets`). Once the
    nodes that fill up first are full, a first-fit scan no longer walks over all of them
    for every job. With a floor of zero it is `buckets` itself."""

    def __init__(self, labels: dict[str, str], floor: tuple[int, int] = (0, 0)) -> None:
        self.labels = labels
        self.buckets: dict[int, dict[str, NodeView]] = {}
        self.floor_cpu, self.floor_memory = floor
        self.filtered = floor != (0, 0)
        self.roomy = self.buckets if not self.filtered else {}

    def add(self, node: NodeView) -> None:
        free = len(node.free_devices)
        self.buckets.setdefault(free, {})[node.name] = node
        if self.filtered and (
            node.free_cpu >= self.floor_cpu and node.free_memory >= self.floor_memory
        ):
            self.roomy.setdefault(free, {})[node.name] = node

    def move(self, node: NodeView, old_free: int) -> None:
        del self.buckets[old_free][node.name]
        if self.filtered:
            self.roomy.get(old_free, {}).pop(node.name, None)
        self.add(node)

    def scan_buckets(self, request: Resources) -> dict[int, dict[str, NodeView]]:
        """The buckets a scan for a task asking `request` must look at: `roomy` if the
        request is at least the floor, else all of them."""
        if request.cpu >= self.floor_cpu and request.memory >= self.floor_memory:
            return self.roomy
        return self.buckets

    def resized(self, node: NodeView) -> bool:
        """The node's free cpu or memory changed, its devices did not: keep `roomy` true.
        True if the node came back into it (its bucket is then filtered again, in order)."""
        if not self.filtered:
            return False
        free = len(node.free_devices)
        bucket = self.buckets.get(free)
        if bucket is None or node.name not in bucket:
            return False  # the index is stale (devices changed outside it): rebuilt anyway
        roomy = self.roomy.setdefault(free, {})
        if node.free_cpu < self.floor_cpu or node.free_memory < self.floor_memory:
            roomy.pop(node.name, None)
            return False
        if node.name in roomy:
            return False
        cpu, memory = self.floor_cpu, self.floor_memory
        self.roomy[free] = {
            name: n for name, n in bucket.items() if n.free_cpu >= cpu and n.free_memory >= memory
        }
        return True


@dataclass(frozen=True)
class Bind:
    job_id: int
    task_id: int
    node: str
    devices: tuple[int, ...]
    action: str
    instance: str = ""  # the MIG instance's UUID on `devices[0]` ("": none)


def new_bind(
    job_id: int, task_id: int, node: str, devices: tuple[int, ...], action: str, instance: str = ""
) -> Bind:
    """`Bind(job_id, task_id, node, devices, action, instance)`, made without the frozen dataclass's
    `__init__` (one `object.__setattr__` per field): the same object, about three times
    cheaper, for the one bind per task a replay makes (`tests/core/test_statement.py`
    checks it equals `Bind(...)`)."""
    bind = _new_object(Bind)
    _set_attribute(
        bind,
        "__dict__",
        {
            "job_id": job_id,
            "task_id": task_id,
            "node": node,
            "devices": devices,
            "action": action,
            "instance": instance,
        },  # fmt: skip
    )
    return bind


_new_object = object.__new__
_set_attribute = object.__setattr__


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
    detail: str = ""  # the node count explanation alone
    node_reasons: dict[str, int] = field(default_factory=dict)

    def status(self) -> Status:
        return Status(self.code, self.message, dict(self.node_reasons))


@dataclass
class QueueState:
    info: QueueInfo
    allocated: Resources = field(default_factory=Resources)  # gpu: whole devices
    shared_gpu: int = 0  # thousandths of a GPU held as fractions
    jobs: list[JobInfo] = field(default_factory=list)  # admitted candidates, in order


class Spare:
    """Per node, what the reserved job will not need at its start: what the node has then
    (`room`) less what the reserved job takes there (`taken`), less what backfilled jobs
    that run past the start took since. Worked out per node when asked.

    For a reserved job asking MIG instances, `instances`: per (node, profile) of each
    profile it asks, the instances free at its start that it does not take, less those
    backfilled jobs running past the start took since (other profiles are not kept: the
    reserved job needs none of them)."""

    __slots__ = ("room", "taken", "changed", "initial", "total", "first_instances", "instances")

    def __init__(
        self,
        room: dict[str, Resources],
        taken: dict[str, Resources],
        total: Resources,
        instances: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.room = room
        self.taken = taken
        self.changed: dict[str, Resources] = {}
        self.initial = total  # summed over the nodes
        self.total = total
        self.first_instances = instances or {}
        self.instances = dict(self.first_instances)

    def instances_left(self, node: str, profile: str) -> int | None:
        """The instances of `profile` on `node` the reserved job leaves (None: not kept)."""
        return self.instances.get((node, profile))

    def take_instance(self, node: str, profile: str) -> None:
        key = (node, profile)
        if key in self.instances:
            self.instances[key] -= 1

    def get(self, node: str) -> Resources | None:
        spare = self.changed.get(node)
        if spare is not None:
            return spare
        room = self.room.get(node)
        if room is None or node not in self.taken:
            return room
        return room - self.taken[node]

    def take(self, node: str, used: Resources) -> None:
        spare = self.get(node)
        if spare is not None:  # (`-` spelled out: once per task backfill starts)
            cpu, memory, gpu = used
            self.changed[node] = tuple_new(
                Resources, (spare.cpu - cpu, spare.memory - memory, spare.gpu - gpu)
            )
            total = self.total
            self.total = tuple_new(
                Resources, (total.cpu - cpu, total.memory - memory, total.gpu - gpu)
            )

    def copy(self) -> Spare:
        """The same spare with nothing taken since (the room and taken are shared)."""
        return Spare(self.room, self.taken, self.initial, self.first_instances)


@dataclass
class Reservation:
    """EASY's one reservation: the first job blocked by resources and when it can start."""

    job: JobInfo
    start: float | None  # None: resources held by jobs without walltime, start unknown
    spare: Spare
    placed: bool = True  # False: it fits nowhere even once everything ends (nominated nodes)
