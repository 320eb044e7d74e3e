"""The shortcuts for waiting jobs decide as the code they replaced: the victim search that
does not start when freeing every victim leaves the gang short (`_GangRoom.enough_with`);
backfill taking a kept alike refusal as it stands when no job was tried since
(`Session.refusals_by_tries`); `explain`'s per-node answers kept and brought up to date from
the nodes that changed (`Session._shortfalls`). Each is compared with the long way on
random clusters: the same binds, evictions, statuses (code, message, node reasons in order,
estimated start), failures and factors."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.actions import _free_into, _future_room, _GangRoom, enqueue
from scheduler.core.cycle import run_cycle
from scheduler.core.model import QueueInfo, SchedulingPolicy, Snapshot
from scheduler.core.plugins import default_plugins
from scheduler.core.resources import Resources
from scheduler.core.session import _FREE_OF, Session
from tests.core.builders import NOW, job, node
from tests.core.test_alike_refusals import _decide as _decide_alike
from tests.core.test_alike_refusals import _outcome, alike_clusters
from tests.core.test_properties import CONFIGS, FAST, clusters
from tests.core.test_steady_shortcuts import random_snapshot

POLICY = SchedulingPolicy()


def decided(snap: Snapshot, config: SchedulingPolicy) -> Any:
    """Everything a cycle decided: binds, evictions, statuses (with their messages, node
    reasons in order and estimates) and factors."""
    result = run_cycle(snap, config)
    return _outcome(result), result.factors


# --- the victim search -------------------------------------------------------------------


def test_enough_with_every_victim_is_freeing_them_one_by_one() -> None:
    """`enough_with` says what freeing each victim into the room in turn (`_free_into`)
    then asking `enough` says, and changes neither the room nor the shared devices."""
    answers: list[bool] = []
    for seed in range(600):
        _compare_enough_with(seed, answers)
    assert answers.count(True) > 100 and answers.count(False) > 100


def _compare_enough_with(seed: int, answers: list[bool]) -> None:
    rng = random.Random(seed)
    snap = random_snapshot(rng)
    session = Session(snap, POLICY, default_plugins(POLICY))
    enqueue(session)
    running = list(session.running)
    for candidate in session.candidates:
        room, shared = _future_room(session)
        fits = _GangRoom.of(session, candidate, room)
        if fits is None:
            continue
        for _ in range(3):
            victims = rng.sample(running, rng.randint(0, len(running)))
            before = (dict(room), dict(shared.holding), dict(fits.each), fits.total)
            said = fits.enough_with(room, victims, shared)
            assert (dict(room), dict(shared.holding), dict(fits.each), fits.total) == before
            freed, holding = dict(room), shared.holding.copy()
            for victim in victims:
                _free_into(freed, victim, +1, fits, shared)
            assert said == fits.enough(), f"seed {seed}, job {candidate.id}"
            answers.append(said)
            shared.holding = holding  # (as it was: the next sample starts from it)
            fits = _GangRoom.of(session, candidate, room)
            assert fits is not None


@pytest.mark.parametrize("strict", [True, False])
def test_preempt_and_reclaim_decide_as_with_the_search_always_run(
    strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SchedulingPolicy(strict_order=strict)
    evicted = 0
    said: list[bool] = []
    asked = _GangRoom.enough_with

    def counted(self: _GangRoom, *args: Any) -> bool:
        said.append(asked(self, *args))
        return said[-1]

    for seed in range(400):
        snap = random_snapshot(random.Random(seed))
        with monkeypatch.context() as patched:
            patched.setattr(_GangRoom, "enough_with", counted)
            now = decided(snap, config)
        with monkeypatch.context() as patched:
            patched.setattr(_GangRoom, "enough_with", lambda *_: True)  # (the search runs)
            before = decided(snap, config)
        assert now == before, f"seed {seed}"
        evicted += len(now[0][1])
    assert said.count(False) > 50 and evicted > 50  # the search is skipped; victims are taken


# --- backfill's kept refusals --------------------------------------------------------------


def _decide(snap: Snapshot, config: SchedulingPolicy, explain: bool, shortcut: bool) -> Any:
    """`test_alike_refusals._decide` (refusing alike jobs together), with kept refusals
    taken by tries or always compared (`shortcut`)."""
    opened = Session._open_shortcuts

    def open_shortcuts(self: Session) -> None:
        opened(self)
        self.refusals_by_tries = shortcut

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Session, "_open_shortcuts", open_shortcuts)
        return _decide_alike(snap, config, True, explain)


@FAST
@given(st.one_of(alike_clusters(), clusters()), CONFIGS, st.booleans())
def test_kept_refusals_taken_by_tries_decide_as_compared(
    snap: Snapshot, config: SchedulingPolicy, explain: bool
) -> None:
    assert _decide(snap, config, explain, True) == _decide(snap, config, explain, False)


def test_a_kept_refusal_is_compared_once_a_job_was_tried() -> None:
    """Alike jobs refused around the reservation, then a job that takes their queue to its
    capability: the next alike job is refused by the capability, with the count on as off
    (a count not bumped by the job tried in between would keep the stale refusal)."""
    queues = [QueueInfo("default", weight=1, capability=Resources(3000, 64 << 30, 9))]
    running = job(2, gpu=2, running_on=[("n0", (0, 1))], walltime=100.0)
    jobs = [running, job(1, gpu=4, created_at=1.0)]
    jobs += [job(i, gpu=2, walltime=5000.0, created_at=float(i)) for i in (3, 4)]
    jobs.append(job(5, cpu=2, created_at=5.0, walltime=5000.0))
    jobs.append(job(6, gpu=2, walltime=5000.0, created_at=6.0))
    snap = Snapshot(NOW, [node("n0", gpus=4, cpu=4, memory_gi=64)], queues, jobs)
    config = SchedulingPolicy.easy()
    with_count = _decide(snap, config, True, True)
    assert with_count == _decide(snap, config, True, False)
    assert {s[0]: s[1] for s in with_count[0][2]}[6] == "QueueQuota"


def test_kept_refusals_on_random_clusters() -> None:
    for seed in range(300):
        snap = random_snapshot(random.Random(seed))
        for explain in (True, False):
            assert _decide(snap, POLICY, explain, True) == _decide(snap, POLICY, explain, False)


# --- explain's per-node answers ------------------------------------------------------------


def _shortfalls_afresh(
    self: Session, eligible: list[Any], request: Any
) -> tuple[int, ...]:  # (the code `_shortfalls` replaced: every node asked every time)
    return tuple(
        int.from_bytes(bytes(free(node) < need for node in eligible), "little")
        for free, need in zip(_FREE_OF, request, strict=True)
    )


@FAST
@given(st.one_of(alike_clusters(), clusters()), CONFIGS)
def test_node_reasons_kept_up_to_date_as_asked_afresh(
    snap: Snapshot, config: SchedulingPolicy
) -> None:
    _node_reasons_both_ways(snap, config)


def test_node_reasons_on_random_clusters() -> None:
    for seed in range(300):
        snap = random_snapshot(random.Random(seed))
        for config in (POLICY, SchedulingPolicy(strict_order=False)):
            _node_reasons_both_ways(snap, config)


def _node_reasons_both_ways(snap: Snapshot, config: SchedulingPolicy) -> None:
    """The cycle decides as with every node asked afresh each time, and each of
    `_shortfalls`' answers is what asking afresh says as it is given."""
    kept = Session._shortfalls
    wrong: list[Any] = []  # (an assertion in the cycle would be caught as the job's fault)

    def checked(self: Session, eligible: list[Any], request: Any) -> tuple[int, ...]:
        answer = kept(self, eligible, request)
        if answer != _shortfalls_afresh(self, eligible, request):
            wrong.append((request, [n.name for n in eligible]))
        return answer

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Session, "_shortfalls", checked)
        now = decided(snap, config)
    assert not wrong
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Session, "_shortfalls", _shortfalls_afresh)
        assert now == decided(snap, config)
