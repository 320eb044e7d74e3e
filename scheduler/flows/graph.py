"""What a flow should do next, decided from its steps and its own jobs (no Django).

`decide()` takes a flow's steps (dependencies, fan-out) and the states of the jobs this flow
created, and returns the state of every step, the jobs to create, whether every active job
must be stopped (fail-fast or cancel) and the flow's final state once it has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ACTIVE = ("Pending", "Running", "Terminating", "Suspended")
SETTLED = ("Succeeded", "Failed", "Cancelled", "Skipped")


@dataclass
class StepJob:
    id: int
    item: int
    state: str


@dataclass
class StepView:
    name: str
    depends_on: list[str]
    fan_out: int  # how many jobs the step makes: one per item, or one
    jobs: list[StepJob] = field(default_factory=list)
    state: str = "Pending"  # as last saved: Skipped and Cancelled stay


@dataclass
class FlowDecision:
    steps: dict[str, str]
    create: list[tuple[str, int]]  # (step, item index) of jobs to create now
    stop_all: bool
    state: str | None  # the flow's final state, or None while it goes on
    failed: tuple[str, StepJob] | None  # the first step job that failed


def decide(steps: list[StepView], *, fail_fast: bool, cancel: bool) -> FlowDecision:
    by_name = {s.name: s for s in steps}
    failed: tuple[str, StepJob] | None = None
    for step in steps:
        for job in sorted(step.jobs, key=lambda j: j.id):
            if job.state == "Failed" and (failed is None or job.id < failed[1].id):
                failed = (step.name, job)
    stopping = cancel or (fail_fast and failed is not None)

    states: dict[str, str] = {}
    for name in _topological(steps):
        step = by_name[name]
        states[name] = _step_state(step, states, stopping)

    create: list[tuple[str, int]] = []
    if not stopping:
        for step in steps:
            if states[step.name] in ("Ready", "Running") and len(step.jobs) < step.fan_out:
                made = {j.item for j in step.jobs}
                create += [(step.name, i) for i in range(step.fan_out) if i not in made]
    shown = {n: ("Running" if s == "Ready" else s) for n, s in states.items()}
    active = any(j.state in ACTIVE for s in steps for j in s.jobs)
    final: str | None = None
    if not active and not create and all(s in SETTLED for s in shown.values()):
        if cancel:
            final = "Cancelled"
        elif any(s == "Failed" for s in shown.values()) or failed is not None:
            final = "Failed"
        else:
            final = "Succeeded"
    return FlowDecision(shown, create, stopping and active, final, failed)


def _step_state(step: StepView, states: dict[str, str], stopping: bool) -> str:
    if step.state in ("Skipped", "Cancelled") and not any(j.state in ACTIVE for j in step.jobs):
        return step.state
    jobs = step.jobs
    if any(j.state in ACTIVE for j in jobs):
        return "Running"
    if jobs:
        if any(j.state == "Failed" for j in jobs):
            return "Failed"
        if len(jobs) == step.fan_out and all(j.state == "Succeeded" for j in jobs):
            return "Succeeded"
        if stopping or any(j.state == "Cancelled" for j in jobs):
            return "Cancelled"
        return "Running"  # some items done, more to create
    deps = [states[d] for d in step.depends_on]
    if any(d in ("Failed", "Skipped", "Cancelled") for d in deps) or stopping:
        return "Skipped"
    if all(d == "Succeeded" for d in deps):
        return "Ready"
    return "Pending"


def _topological(steps: list[StepView]) -> list[str]:
    """Steps with every dependency before its dependents (specs are checked acyclic).
    Iterative, so a long chain of steps never reaches Python's recursion limit."""
    order: list[str] = []
    seen: set[str] = set()
    deps = {s.name: s.depends_on for s in steps}
    for step in steps:
        if step.name in seen:
            continue
        seen.add(step.name)
        # (name, its dependencies still to visit); a name is placed once all of them are.
        stack: list[tuple[str, list[str]]] = [(step.name, deps[step.name][::-1])]
        while stack:
            name, todo = stack[-1]
            while todo and (todo[-1] in seen or todo[-1] not in deps):
                todo.pop()
            if not todo:
                order.append(name)
                stack.pop()
                continue
            dep = todo.pop()
            seen.add(dep)
            stack.append((dep, deps[dep][::-1]))
    return order
