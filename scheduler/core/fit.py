"""Could a job ever run on this cluster? Pure checks shared by submit and the core.

A job "never fits" when no registered node could hold one of its tasks even empty (a request
larger than every node's allocatable, a node selector no node matches), or when the gang's
first `min_available` tasks cannot be placed together on the whole empty cluster, first fit
in node-name order as the core's own gang check does (scheduler/core/actions.py). Submit
refuses such a job with a 400 naming the field, the request and the largest offer, as sbatch
refuses a configuration that is not available.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.core.quantity import GPU_MILLI, format_memory, gpu_milli
from scheduler.core.resources import DIMENSIONS, Resources

MAX_LISTED = 3  # node selector values listed in a refusal
MIG = "mig"  # the sharing mode of MIG instances (scheduler.agent.wire.GPU_SHARING_MODES)


@dataclass(frozen=True, slots=True)
class Offer:
    """A registered node as submit sees it: what it could give one job, empty."""

    name: str
    allocatable: Resources
    labels: dict[str, str] = field(default_factory=dict)
    sharing: tuple[str, ...] = ()  # the GPU sharing modes it offers
    gpu_memory: int = 0  # its largest GPU's memory (bytes; 0: not known)
    mig: dict[str, int] = field(default_factory=dict)  # its MIG instances: profile -> count

    def matches(self, selector: dict[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True, slots=True)
class Ask:
    """One task group of a spec: `path` names it in refusals (e.g. "tasks.0")."""

    path: str
    group: str
    resources: Resources
    replicas: int = 1
    node_selector: dict[str, str] = field(default_factory=dict)
    gpu_share: int = 0  # a fraction of one GPU, in thousandths (resources.gpu is then 1)
    gpu_memory: int = 0
    gpu_modes: tuple[str, ...] = ()  # the sharing modes its queue allows (empty: any)
    gpu_mig: str = ""  # a MIG profile ("1g.10gb"; gpu_share is then what it counts as)

    def takes_anywhere(self, offers: Sequence[Offer]) -> bool:
        return any(self.takes(o) for o in offers)

    def takes(self, offer: Offer) -> bool:
        """Could the offer hold this task's fraction of a GPU (always, for no fraction)?"""
        if not self.gpu_share:
            return True
        if self.gpu_mig:
            allowed = not self.gpu_modes or MIG in self.gpu_modes
            return allowed and MIG in offer.sharing and offer.mig.get(self.gpu_mig, 0) > 0
        modes = [m for m in offer.sharing if not self.gpu_modes or m in self.gpu_modes]
        return bool(modes) and offer.gpu_memory >= self.gpu_memory


def never_fits(asks: Sequence[Ask], min_available: int, offers: Sequence[Offer]) -> dict[str, str]:
    """Why the job could never run on `offers`: field path -> message. Empty when it could,
    and always empty with no node registered (a fresh cluster accepts anything)."""
    if not offers:
        return {}
    problems: dict[str, str] = {}
    for ask in asks:
        problems.update(_task_problems(ask, offers))
    if problems:
        return problems
    return _gang_problems(asks, min_available, offers)


def over_capability(
    asks: Sequence[Ask], min_available: int, capability: dict[str, int | None], queue: str
) -> dict[str, str]:
    """Why the job's gang needs more than its queue may ever hold (`capability`: resource ->
    limit, None or missing for unlimited), as the core's capability check says it."""
    gang = list(_tasks_in_core_order(asks))[:min_available]
    need = sum((a.resources for a in gang), Resources())
    # GPUs in thousandths: a fraction as its share, a MIG instance as its slices of seven.
    milli = sum(gpu_milli(a.resources.gpu, a.gpu_share) for a in gang)
    for dim in DIMENSIONS:
        limit = capability.get(dim)
        if limit is None:
            continue
        over = milli > limit * GPU_MILLI if dim == "gpu" else getattr(need, dim) > limit
        if over:
            wanted = f"{milli / GPU_MILLI:g}" if dim == "gpu" else need.describe(dim)
            return {
                "queue": (
                    f"{len(gang)} task{'s' if len(gang) > 1 else ''} starting together need"
                    f' {dim} {wanted}, more than queue "{queue}" may ever hold'
                    f" ({Resources(**{dim: limit}).describe(dim)})"
                )
            }
    return {}


def _task_problems(ask: Ask, offers: Sequence[Offer]) -> dict[str, str]:
    matching = [o for o in offers if o.matches(ask.node_selector)]
    if not matching:
        return {f"{ask.path}.node_selector": _selector_message(ask.node_selector, offers)}
    if ask.gpu_share:
        fraction = _fraction_problems(ask, matching)
        if fraction:
            return fraction
        matching = [o for o in matching if ask.takes(o)]
    problems = {}
    for dim in DIMENSIONS:
        wanted = getattr(ask.resources, dim)
        largest = max(getattr(o.allocatable, dim) for o in matching)
        if wanted > largest:
            problems[f"{ask.path}.resources.{dim}"] = (
                f"{ask.resources.describe(dim)} per task requested, the largest"
                f"{' matching' if ask.node_selector else ''} node has"
                f" {Resources(**{dim: largest}).describe(dim)}"
            )
    if problems:
        return problems
    if not any(ask.resources.fits_in(o.allocatable) for o in matching):
        return {
            f"{ask.path}.resources": (
                f"{_describe(ask.resources)} per task requested, no single node has all of it"
                f" (largest: {_largest(matching)})"
            )
        }
    return {}


def _fraction_problems(ask: Ask, offers: Sequence[Offer]) -> dict[str, str]:
    """Why no node of `offers` could ever hold the ask's fraction of a GPU."""
    if ask.gpu_mig:
        return _mig_problems(ask, offers)
    share = f"{ask.gpu_share / 1000:g}"
    gpus = [o for o in offers if o.allocatable.gpu]
    if not gpus:
        return {f"{ask.path}.resources.gpu": f"{share} of a GPU requested, no node has a GPU"}
    sharing = [o for o in gpus if any(not ask.gpu_modes or m in ask.gpu_modes for m in o.sharing)]
    if not sharing:
        modes = f" in a mode the queue allows ({', '.join(ask.gpu_modes)})" if ask.gpu_modes else ""
        return {
            f"{ask.path}.resources.gpu": (
                f"{share} of a GPU requested, no node with GPUs offers GPU sharing{modes}"
                f" (largest offer: {max(o.allocatable.gpu for o in gpus)} whole GPUs)"
            )
        }
    largest = max(o.gpu_memory for o in sharing)
    if ask.gpu_memory > largest:
        return {
            f"{ask.path}.resources.gpu_memory": (
                f"{format_memory(ask.gpu_memory)} of GPU memory requested, the largest GPU"
                f" that may be shared has {format_memory(largest)}"
            )
        }
    return {}


def _mig_problems(ask: Ask, offers: Sequence[Offer]) -> dict[str, str]:
    """Why no node of `offers` could ever hold a MIG instance of the ask's profile."""
    if ask.takes_anywhere(offers):
        return {}
    offering = [o for o in offers if MIG in o.sharing and o.mig]
    if ask.gpu_modes and MIG not in ask.gpu_modes:
        why = f"the queue allows only {', '.join(ask.gpu_modes)}"
    elif not offering:
        why = "no node offers MIG instances"
    else:
        profiles = sorted({p for o in offering for p in o.mig})
        shown = ", ".join(profiles[:8]) + (", ..." if len(profiles) > 8 else "")
        why = f"no node has an instance of it (offered: {shown})"
    return {f"{ask.path}.resources.gpu": f"MIG profile {ask.gpu_mig} requested, {why}"}


def _selector_message(selector: dict[str, str], offers: Sequence[Offer]) -> str:
    wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
    for key, value in sorted(selector.items()):
        if any(o.labels.get(key) == value for o in offers):
            continue
        values = sorted({o.labels[key] for o in offers if key in o.labels})
        shown = ", ".join(values[:MAX_LISTED]) + (", ..." if len(values) > MAX_LISTED else "")
        offered = f"nodes have {key}={shown}" if values else f"no node has a {key} label"
        return f"no registered node matches {wanted} ({offered})"
    return f"no registered node matches {wanted} (no node has all of these labels)"


def _gang_problems(
    asks: Sequence[Ask], min_available: int, offers: Sequence[Offer]
) -> dict[str, str]:
    """Place the first `min_available` tasks (groups in name order, as the core orders
    them) first fit on the empty cluster; a miss means the gang never starts."""
    gang = list(_tasks_in_core_order(asks))[:min_available]
    room = {o.name: o.allocatable for o in offers}
    devices = {o.name: [1000] * o.allocatable.gpu for o in offers}  # thousandths free each
    instances = {o.name: dict(o.mig) for o in offers}  # MIG instances left, per profile
    for placed, ask in enumerate(gang):
        for offer in offers:
            free = room[offer.name]
            if not (offer.matches(ask.node_selector) and ask.takes(offer)):
                continue
            if ask.resources.cpu > free.cpu or ask.resources.memory > free.memory:
                continue
            if _take_devices(devices[offer.name], instances[offer.name], ask):
                room[offer.name] = free - Resources(ask.resources.cpu, ask.resources.memory)
                break
        else:
            total = sum((o.allocatable for o in offers), Resources())
            need = sum((a.resources for a in gang), Resources())
            return {
                "min_available": (
                    f"{len(gang)} tasks must start together ({_describe(need)} in all), but"
                    f" only {placed} fit on the whole cluster even when empty"
                    f" ({len(offers)} nodes, {_describe(total)} in all)"
                )
            }
    return {}


def _take_devices(free: list[int], instances: dict[str, int], ask: Ask) -> bool:
    """Take the ask's GPUs from `free` (thousandths per device), first fit: a fraction the
    first device with room, whole GPUs whole free devices, a MIG instance one of
    `instances`. False (nothing taken) if none."""
    if ask.gpu_mig:
        if instances.get(ask.gpu_mig, 0) < 1:
            return False
        instances[ask.gpu_mig] -= 1
        return True
    wanted = ask.gpu_share or 1000
    picked = [i for i, left in enumerate(free) if left >= wanted]
    count = 1 if ask.gpu_share else ask.resources.gpu
    if len(picked) < count:
        return False
    for i in picked[:count]:
        free[i] -= wanted
    return True


def _tasks_in_core_order(asks: Iterable[Ask]) -> Iterable[Ask]:
    for ask in sorted(asks, key=lambda a: a.group):
        for _ in range(ask.replicas):
            yield ask


def _describe(resources: Resources) -> str:
    return ", ".join(f"{d} {resources.describe(d)}" for d in DIMENSIONS if getattr(resources, d))


def _largest(offers: Sequence[Offer]) -> str:
    biggest = max(
        offers, key=lambda o: (o.allocatable.gpu, o.allocatable.cpu, o.allocatable.memory)
    )
    return f"{biggest.name} with {_describe(biggest.allocatable) or 'nothing'}"
