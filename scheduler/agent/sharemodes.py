"""What each way of holding a GPU isolates, written once (Django-free; imports only the wire).

The agent (agent/gpumodes.py) runs a task's share under these modes; the server, the job page,
the REST job detail and `berth show` say which mode a task got and what it isolates with the
same words. `mode_of` is the agent's rule for which mode a share runs under, so the server
names the mode the agent gives."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.agent.wire import GPU_SHARING_MODES

MIG, MPS, TIMESLICE = GPU_SHARING_MODES
EXCLUSIVE = "exclusive"  # whole GPUs: held by one task alone
# What each mode keeps apart between the tasks sharing one GPU, and the one line the pages,
# the REST API and `berth show` print for a task holding a GPU that way (`label`).
ISOLATION: dict[str, dict[str, str]] = {
    MIG: {
        "memory": "isolated",
        "faults": "isolated",
        "compute": "partitioned",
        "summary": "a hardware slice of the GPU: its own memory, cache and compute units; a"
        " fault stays inside its instance",
        "label": "MIG instance: memory and faults isolated",
    },
    MPS: {
        "memory": "limited",
        "faults": "shared",
        "compute": "limited",
        "summary": "one CUDA context per GPU with a thread percentage and a pinned memory"
        " limit per task; a fatal GPU fault in one task ends every task on that GPU",
        "label": "MPS: memory and compute limits enforced, faults shared",
    },
    TIMESLICE: {
        "memory": "none",
        "faults": "shared",
        "compute": "none",
        "summary": "tasks take turns on the whole GPU: no memory or compute limit, one task"
        " may use all the memory, and a fault may end them all",
        "label": "time-slicing: no isolation",
    },
}
LABELS: dict[str, str] = {
    **{mode: isolation["label"] for mode, isolation in ISOLATION.items()},
    EXCLUSIVE: "whole GPU: exclusive",
}


def mode_of(share: float, mig: str, offered: Iterable[str]) -> str:
    """The mode a task holding `share` of a GPU (1: whole) runs under on a node offering
    `offered`: its MIG instance (`mig`, a UUID or profile), else MPS wherever the node offers
    it, else time-slicing; "" where a share has no mode there (the agent refuses it)."""
    modes = set(offered)
    if mig:
        return MIG
    if share >= 1:
        return EXCLUSIVE
    return MPS if MPS in modes else TIMESLICE if TIMESLICE in modes else ""


def describe(mode: str) -> dict[str, str] | None:
    """`{"mode", "isolation"}` as the REST job detail gives it (None: no GPU)."""
    return {"mode": mode, "isolation": LABELS[mode]} if mode in LABELS else None
