"""Fractions of a GPU in the cycle (issue #23): where a fraction may go, which node and
device the placement policy picks, and when a shared device comes back whole.

A fraction (`TaskInfo.gpu_share` thousandths of one device, optionally `gpu_memory` bytes)
goes on one device of a node that offers GPU sharing in a mode the task's queue allows: a
device already holding fractions with enough share (and memory) left, or a whole free device,
which then holds fractions only until they have all ended. Whole-GPU tasks take only devices
in `NodeView.free_devices`, so they never share.

In the sums the rest of the core works with (`Resources.gpu`: whole devices) a fraction asks
for the one device it may have to open (`resources.gpu` is 1). Where a gang's fractions are
planned together (the backfill reservation's `actions.simulate`, start estimates in
`plan.py`) a run of alike fractions is packed, `per_device` of them to each device it opens,
as allocation puts them together; a backfilled fraction still takes a whole device of the
reservation's spare: never optimistic, at worst a later estimate. A shared device comes
back whole, in plans, when its last occupant leaves (`releasers`, by `Session.leaves_at`:
one being released or suspended leaves now); a device a fraction was bound to in the cycle
never does in that cycle's plans (`Session.pin_shared`), as a whole device bound in it.
DRF, queue capabilities and per-user GPU limits count what a task holds in thousandths
(`gpu_milli`: a fraction its share, a MIG instance its slices of seven).

A MIG instance (`TaskInfo.gpu_mig`, a profile such as "1g.10gb") goes only on a free instance
of exactly that profile on a node offering `mig` (`NodeView.mig_free`), never on a whole or
shared device, and a GPU in MIG mode is never whole or shared (`NodeView` leaves it out of
both). It counts as its `gpu_share` (its slices of seven) in DRF, accounting, queue
capabilities and per-user GPU limits, and as no whole device in the core's device sums:
a MIG GPU never comes back whole. Plans count instances apart, per node and profile, as
they are given back (`instance_releases`): start estimates (`plan.py`) and the backfill
reservation (`backfill.py`, whose spare keeps the instances its holder needs) wait for a
free instance of the profile. Instances of a profile
are taken first fit, in the node order and GPU order.

The node and device are chosen by the cluster's policy (`SchedulingPolicy.gpu_placement`):
`fgd` (fragmentation gradient descent over the typical shapes of the tasks in the snapshot,
`scheduler.core.gpushare.FGD`), `best-fit` or `first-fit` (the first node in the session's
node order, the first device with room).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.core import gpushare, quantity
from scheduler.core.model import JobInfo, TaskInfo
from scheduler.core.types import NodeView

MIG = "mig"  # the sharing mode (scheduler.agent.wire.GPU_SHARING_MODES) of MIG instances
MILLI = gpushare.MILLI
MIB = 2**20
Ends = Callable[[JobInfo, TaskInfo], float | None]


def never_reason(node: NodeView, task: TaskInfo) -> str | None:
    """Why the node can never take the fraction (None: it may, room permitting)."""
    if task.gpu_mig:
        return _mig_never_reason(node, task)
    if not node.sharing:
        return "no GPU sharing"
    if task.gpu_modes and not any(mode in task.gpu_modes for mode in node.sharing):
        return "GPU sharing mode not allowed by the queue"
    if task.gpu_memory and not any(m >= task.gpu_memory for m in node.device_memory.values()):
        return "insufficient gpu memory"
    return None


def _mig_never_reason(node: NodeView, task: TaskInfo) -> str | None:
    if task.gpu_mig not in node.mig_profiles:
        return f"no MIG instance {task.gpu_mig}"
    if MIG not in node.sharing:
        return "no GPU sharing"
    if task.gpu_modes and MIG not in task.gpu_modes:
        return "GPU sharing mode not allowed by the queue"
    return None


def options(node: NodeView, task: TaskInfo) -> list[int]:
    """The devices the fraction fits on now, by index."""
    if task.gpu_mig:
        return sorted({d for d, _ in node.mig_free.get(task.gpu_mig, ())})
    share, memory = task.gpu_share, task.gpu_memory
    found = [
        d
        for d, free in node.shared.items()
        if free >= share and (not memory or node.shared_memory.get(d, 0) >= memory)
    ]
    found += [d for d in node.free_devices if not memory or node.device_memory.get(d, 0) >= memory]
    return sorted(found)


def fits(node: NodeView, task: TaskInfo) -> bool:
    return never_reason(node, task) is None and bool(options(node, task))


def take(node: NodeView, task: TaskInfo, device: int, instance: str = "") -> bool:
    """Put the fraction on the device; True if it opened a whole free device. A MIG task
    takes `instance` (a placed task's) or the first free one of its profile there."""
    if task.gpu_mig:
        free = node.mig_free.get(task.gpu_mig, [])
        mine = [i for i in free if i[0] == device and (not instance or i[1] == instance)]
        if mine:
            free.remove(mine[0])
            node.mig_held[task.id] = mine[0]
        return False
    opened = device in node.shared
    if not opened:
        node.free_devices.remove(device)
        node.shared[device] = MILLI
        node.shared_memory[device] = node.device_memory.get(device, 0)
    node.shared[device] -= task.gpu_share
    node.shared_memory[device] -= task.gpu_memory
    return not opened


def give_back(node: NodeView, task: TaskInfo, device: int) -> bool:
    """Undo `take`; True if the device is whole and free again (a MIG GPU never is)."""
    if task.gpu_mig:
        held = node.mig_held.pop(task.id, None)
        if held is not None:
            free = node.mig_free.setdefault(task.gpu_mig, [])
            free.append(held)
            free.sort()
        return False
    if device not in node.shared:
        return False
    node.shared[device] += task.gpu_share
    node.shared_memory[device] += task.gpu_memory
    if node.shared[device] < MILLI:
        return False
    del node.shared[device], node.shared_memory[device]
    node.free_devices = sorted([*node.free_devices, device])
    return True


def gpu_milli(task: TaskInfo) -> int:
    """What the task asks or holds of GPUs, in thousandths of one: whole devices 1000
    each, a fraction its share, a MIG instance its slices of seven (`quantity.mig_share`,
    which is its `gpu_share`). The figure GPU limits and quotas sum (`quantity.gpu_milli`)."""
    return quantity.gpu_milli(task.resources.gpu, task.gpu_share)


def per_device(task: TaskInfo) -> int:
    """How many fractions like `task` (not a MIG instance) the plans put on one device:
    as many as their shares fit; one for a fraction asking GPU memory (the plans do not
    follow each device's memory)."""
    return 1 if task.gpu_memory else MILLI // task.gpu_share


def instance_releases(node: NodeView, profile: str, end: Ends) -> tuple[int, list[float | None]]:
    """The node's instances of the MIG profile free now, and when each held one is given
    back: at its occupant's `end` (None: never). The one count of instances over time for
    start estimates (`plan.py`) and the backfill reservation (`backfill.py`); an instance
    a task took in the cycle is not among them: held, as whole devices bound then are."""
    held = [end(job, task) for job, task in node.tasks if task.gpu_mig == profile]
    return len(node.mig_free.get(profile, ())), held


def instance_of(node: NodeView, task: TaskInfo) -> str:
    """The UUID of the MIG instance the task holds on the node ("": none)."""
    held = node.mig_held.get(task.id)
    return held[1] if held else ""


# --- the placement policy ---------------------------------------------------------------


def policy_for(name: str, tasks: Iterable[TaskInfo]) -> gpushare.Policy:
    """The policy named by `SchedulingPolicy.gpu_placement`; FGD measures its fragmentation
    against the typical shapes of `tasks` (the snapshot's, running and waiting)."""
    if name == "first-fit":
        return gpushare.FirstFit()
    if name == "best-fit":
        return gpushare.BestFit()
    return gpushare.FGD(gpushare.typical_tasks(_gpu_task(t) for t in tasks if not t.gpu_mig))


def _gpu_task(task: TaskInfo) -> gpushare.GpuTask:
    request = task.resources
    devices = request.gpu
    milli = task.gpu_share or (MILLI if devices else 0)
    return gpushare.GpuTask(request.cpu, request.memory // MIB, devices, milli)


def score(
    policy: gpushare.Policy, node: NodeView, position: int, task: TaskInfo
) -> tuple[float, int] | None:
    """The policy's score for the fraction on the node and the device it picks there."""
    allowed = options(node, task)
    if not allowed:
        return None
    devices = sorted([*node.free_devices, *node.shared])
    view = gpushare.GpuNode(
        node.name, node.model, node.allocatable.cpu, node.allocatable.memory // MIB, len(devices)
    )
    view.cpu_free, view.mem_free = node.free_cpu, node.free_memory // MIB
    view.gpu_free = [node.shared.get(d, MILLI) for d in devices]
    choices: list[tuple[int, ...]] = [(devices.index(d),) for d in allowed]
    value, chosen = policy.score(view, position, _gpu_task(task), choices)
    return value, devices[chosen[0]]


def ranked(policy: gpushare.Policy, nodes: list[NodeView], task: TaskInfo) -> list[NodeView]:
    """`nodes` (each able to take the fraction, in the session's order) best first as the
    policy scores them; equals keep their order."""
    if isinstance(policy, gpushare.FirstFit) or task.gpu_mig:
        return nodes
    scores = []
    for position, node in enumerate(nodes):
        scored = score(policy, node, position, task)
        if scored is not None:
            scores.append((-scored[0], position, node))
    scores.sort(key=lambda s: (s[0], s[1]))
    return [node for _, _, node in scores]


def pick_device(policy: gpushare.Policy, node: NodeView, task: TaskInfo) -> int:
    if task.gpu_mig:  # the first GPU with a free instance of the profile
        found = options(node, task)
        if not found:
            raise ValueError(f"{node.name}: no free MIG instance {task.gpu_mig}")
        return found[0]
    scored = score(policy, node, 0, task)
    if scored is None:
        raise ValueError(f"{node.name}: no device has room for a {task.gpu_share}/1000 GPU")
    return scored[1]


# --- when a shared device comes back whole -----------------------------------------------


def releasers(nodes: Iterable[NodeView], end: Ends) -> set[int]:
    """The task per shared device whose end gives the device back whole: the last to end
    when every occupant has an end, else the first (by id) of those without one."""
    chosen: set[int] = set()
    for node in nodes:
        by_device: dict[int, list[tuple[JobInfo, TaskInfo]]] = {}
        for job, task in node.tasks:
            if task.gpu_share and not task.gpu_mig:  # (a MIG GPU never comes back whole)
                for device in task.devices:
                    by_device.setdefault(device, []).append((job, task))
        chosen.update(releaser(occupants, end) for occupants in by_device.values())
    return chosen


def occupants(node: NodeView, device: int) -> list[tuple[JobInfo, TaskInfo]]:
    """The fractions running on the node's device (in the node's task order)."""
    return [(j, t) for j, t in node.tasks if t.gpu_share and device in t.devices]


def releaser(occupants: list[tuple[JobInfo, TaskInfo]], end: Ends) -> int:
    """Of one device's occupants (at least one), the task whose end gives it back whole."""
    ends = [(end(job, task), task.id) for job, task in occupants]
    open_ended = sorted(task_id for at, task_id in ends if at is None)
    if open_ended:
        return open_ended[0]
    return max((at or 0.0, task_id) for at, task_id in ends)[1]
