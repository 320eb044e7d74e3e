"""`in_order_unchanged` (what strict allocate walks to give the jobs behind its blocked one
their status) yields the jobs in the very order `in_order` does, for a caller that changes
no queue while it walks: queues with different weights and holdings, some jobs skipped."""

from __future__ import annotations

import random

import pytest

from scheduler.core.actions import allocate, enqueue, in_order, in_order_unchanged
from scheduler.core.plugins import default_plugins
from scheduler.core.session import Session
from tests.core.builders import POLICIES
from tests.core.test_alike_at_once import random_snapshot


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_it_walks_the_jobs_as_in_order_does(policy: str) -> None:
    config = POLICIES[policy]
    walked = 0
    for seed in range(100):
        snap = random_snapshot(random.Random(seed))
        session = Session(snap, config, default_plugins(config))
        enqueue(session)
        allocate(session)  # (queues then hold what it started)
        rng = random.Random(seed)
        skip = {job.id for job in session.candidates if rng.random() < 0.3}
        expected = [job.id for job in in_order(session, skip_ids=skip)]
        assert [job.id for job in in_order_unchanged(session, skip)] == expected, seed
        walked += len(expected)
    assert walked > 300
