"""Properties of flow planning over random DAGs and random job outcomes (no database)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.flows.graph import ACTIVE, StepJob, StepView, decide


@st.composite
def flows(draw: st.DrawFn) -> tuple[list[StepView], dict[tuple[str, int], bool], int | None, bool]:
    count = draw(st.integers(1, 6))
    steps = []
    for i in range(count):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=2)) if i else []
        steps.append(StepView(f"s{i}", [f"s{d}" for d in deps], draw(st.integers(1, 4))))
    outcomes = {
        (s.name, item): draw(st.booleans()) or draw(st.booleans())  # mostly successes
        for s in steps
        for item in range(s.fan_out)
    }
    parallelism = draw(st.one_of(st.none(), st.integers(1, 3)))
    return steps, outcomes, parallelism, draw(st.booleans())


def simulate(steps, outcomes, parallelism, fail_fast, seed):
    """Drive a flow to its end: outcomes arrive in a random order, as the loop would see
    them. Checks the invariants on the way; returns the final state and step states."""
    rng = random.Random(seed)
    by_name = {s.name: s for s in steps}
    next_id = 1
    held: list[StepJob] = []
    for _ in range(500):
        p = decide(steps, fail_fast=fail_fast, cancel=False)
        for name, item in p.create:
            for dep in by_name[name].depends_on:  # a step starts only after its deps
                assert p.steps[dep] == "Succeeded"
            job = StepJob(next_id, item, "Pending")
            next_id += 1
            by_name[name].jobs.append(job)
            held.append(job)
        for name, state in p.steps.items():
            by_name[name].state = state
        if p.stop_all:
            for s in steps:
                for j in s.jobs:
                    if j.state in ACTIVE:
                        j.state = "Cancelled"
            held.clear()
            continue
        if p.state is not None:
            assert not any(j.state in ACTIVE for s in steps for j in s.jobs)
            assert all(st not in ("Pending", "Running") for st in p.steps.values())
            return p.state, dict(p.steps)
        running = [j for s in steps for j in s.jobs if j.state == "Running"]
        slots = len(held) if parallelism is None else max(0, parallelism - len(running))
        for job in held[:slots]:
            job.state = "Running"
        del held[:slots]
        running = [(s.name, j) for s in steps for j in s.jobs if j.state == "Running"]
        assert parallelism is None or len(running) <= parallelism
        if running:
            name, job = rng.choice(running)
            job.state = "Succeeded" if outcomes[(name, job.item)] else "Failed"
    raise AssertionError("the flow never finished (a stall)")


def _fresh(steps):
    return [StepView(s.name, list(s.depends_on), s.fan_out) for s in steps]


@settings(max_examples=200, deadline=None)
@given(flows(), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_flow_always_finishes_the_same_way_whatever_the_order(flow, seed_a, seed_b):
    steps, outcomes, parallelism, fail_fast = flow
    final_a, steps_a = simulate(_fresh(steps), outcomes, parallelism, fail_fast, seed_a)
    final_b, steps_b = simulate(_fresh(steps), outcomes, parallelism, fail_fast, seed_b)
    assert final_a == final_b
    # The flow succeeds exactly when every job would succeed; else it fails.
    assert final_a == ("Succeeded" if all(outcomes.values()) else "Failed")
    if not fail_fast:
        assert steps_a == steps_b  # without fail-fast every step ends the same way too


def test_it_skips_dependents_of_a_failed_step_and_keeps_independent_branches():
    steps = [StepView("a", [], 1, [StepJob(1, 0, "Failed")]), StepView("b", ["a"], 1),
             StepView("c", [], 1)]  # fmt: skip
    p = decide(steps, fail_fast=False, cancel=False)
    assert p.steps == {"a": "Failed", "b": "Skipped", "c": "Running"}
    assert p.create == [("c", 0)] and p.state is None


def test_fail_fast_stops_everything_and_skips_what_never_started():
    steps = [StepView("train", [], 3, [StepJob(1, 0, "Failed"), StepJob(2, 1, "Running")]),
             StepView("eval", ["train"], 1)]  # fmt: skip
    p = decide(steps, fail_fast=True, cancel=False)
    assert p.stop_all and p.create == []
    assert p.steps == {"train": "Running", "eval": "Skipped"}
    steps[0].jobs[1].state = "Cancelled"
    p = decide(steps, fail_fast=True, cancel=False)
    assert p.state == "Failed" and p.steps == {"train": "Failed", "eval": "Skipped"}
    assert p.failed is not None and p.failed[1].id == 1
