"""A standing session says why each job waits, cycle by cycle, exactly as it did before the
refusals it keeps across cycles (`kept_refusals`, `quick_refusals`) and the shared statuses:
every cycle's statuses (code, message, node reasons, estimated start) hash to what the core
at bbce6f1 gave on the generated GPU trace and the first 2,000 KTH jobs
(`fixtures/standing_statuses.json`)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.cycle import CycleResult
from scheduler.core.replay import replay
from scheduler.core.standing import StandingSession
from tests.core.test_replay import (
    POLICIES,
    generated_cluster,
    generated_trace,
    kth_cluster,
    kth_trace,
)

RECORDED = Path(__file__).parent / "fixtures" / "standing_statuses.json"


def status_hash(monkeypatch: pytest.MonkeyPatch, trace: str, policy: str) -> str:
    """crc32 of every cycle's statuses, in cycle order, jobs by id."""
    crc = 0
    cycle = StandingSession.cycle

    def recording(self: StandingSession, now: float) -> CycleResult:
        nonlocal crc
        result = cycle(self, now)
        rows: list[Any] = [
            [i, s.code.value, s.message, sorted(s.node_reasons.items()), s.estimated_start]
            for i, s in sorted(result.pending.items())
        ]
        crc = zlib.crc32(json.dumps(rows).encode(), crc)
        return result

    monkeypatch.setattr(StandingSession, "cycle", recording)
    if trace == "generated":
        nodes, queues = generated_cluster()
        replay(generated_trace(14, 800), nodes, queues, POLICIES[policy])
    else:
        nodes, queues = kth_cluster()
        replay(kth_trace()[0], nodes, queues, POLICIES[policy])
    monkeypatch.undo()
    return f"{crc:08x}"


@pytest.mark.parametrize(
    ("trace", "policy"),
    [("generated", "easy"), ("generated", "default"), ("generated", "loose"), ("kth", "easy")],
)
def test_every_cycle_says_why_jobs_wait_as_before(monkeypatch, trace, policy):
    recorded = json.loads(RECORDED.read_text())
    assert status_hash(monkeypatch, trace, policy) == recorded[f"{trace}/{policy}"]
