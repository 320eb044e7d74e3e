"""One scheduler leads at a time; a standby takes over when the leader lets go."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from scheduler.leader import FileLeaderLock, PostgresLeaderLock


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
