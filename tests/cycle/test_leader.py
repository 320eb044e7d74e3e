"""One scheduler leads at a time; a standby takes over when the leader lets go."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from scheduler.cycle.leader import FileLeaderLock, PostgresLeaderLock


def test_it_lets_only_one_file_lock_holder_lead(tmp_path: Path):
    leader = FileLeaderLock(tmp_path / "scheduler.lock")
    standby = FileLeaderLock(tmp_path / "scheduler.lock")
    assert leader.try_acquire()
    assert not standby.try_acquire()
    assert leader.still_held()
    leader.release()
    assert standby.try_acquire()
    standby.release()


@pytest.mark.postgres
@pytest.mark.django_db
def test_it_lets_only_one_postgres_session_lead():
    leader = PostgresLeaderLock(dict(connection.settings_dict))
    standby = PostgresLeaderLock(dict(connection.settings_dict))
    try:
        assert leader.try_acquire()
        assert leader.still_held()
        assert not standby.try_acquire()
        assert not standby.still_held()
        leader.release()  # a leader stepping down; one that dies is the e2e failover test
        assert standby.try_acquire()
        assert standby.still_held()
    finally:
        leader.release()
        standby.release()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_leader_whose_lock_passed_to_another_commits_nothing():
    """A leader frozen past its lock's lease (its session ended by the server) wakes up with
    the cycle's decisions in hand: the fence refuses to write them."""
    from scheduler.core.cycle import CycleResult
    from scheduler.cycle import leader as leadership
    from scheduler.cycle.store import apply_decisions, load_snapshot

    old = PostgresLeaderLock(dict(connection.settings_dict))
    new = PostgresLeaderLock(dict(connection.settings_dict))
    try:
        assert old.try_acquire()
        leadership.lead_with(old)
        leadership.fence()  # ours: nothing to say
        loaded = load_snapshot()
        assert old._conn is not None
        with connection.cursor() as cursor:  # what idle_session_timeout does to a frozen one
            cursor.execute("SELECT pg_terminate_backend(%s)", [old._conn.info.backend_pid])
        assert _eventually(new.try_acquire)
        with pytest.raises(leadership.LostLeadership):
            apply_decisions(loaded, CycleResult())
        assert not old.still_held()
    finally:
        leadership.lead_with(None)
        old.release()
        new.release()


def _eventually(check) -> bool:
    import time

    for _ in range(50):
        if check():
            return True
        time.sleep(0.1)
    return False
