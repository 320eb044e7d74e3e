"""PostgreSQL refusing a connection is overload: the API answers 503 + Retry-After."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from berth.web.overload import CONFLICT_DETAIL, DOWN_DETAIL, FULL_DETAIL, is_database_overload
from scheduler.api.errors import exception_handler

pytestmark = pytest.mark.postgres


@pytest.fixture
def refused_connection_error(db: None) -> psycopg.OperationalError:
    """The error PostgreSQL really gives when a role may open no more connections."""
    role = f"berth_test_limited_{uuid.uuid4().hex[:8]}"
    s = connection.settings_dict
    where = {"dbname": s["NAME"], "host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432}
    # Outside the test's transaction: the role must exist for another session to use it.
    with psycopg.connect(**where, user=s["USER"], autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
        try:
            with pytest.raises(psycopg.OperationalError) as refused:
                psycopg.connect(**where, user=role)
        finally:
            admin.execute(f"DROP ROLE {role}")
    return refused.value


def test_a_refused_connection_is_answered_503_with_retry_after(refused_connection_error):
    assert "too many connections" in str(refused_connection_error)
    response = exception_handler(refused_connection_error, {})
    assert response is not None
    assert response.status_code == 503
    assert response["Retry-After"] == "1"


def test_other_database_errors_stay_errors():
    assert not is_database_overload(psycopg.OperationalError("server closed the connection"))
    assert exception_handler(RuntimeError("a bug"), {}) is None


def test_a_database_gone_mid_request_is_answered_503_naming_it(db: None) -> None:
    """The error a request really gets when PostgreSQL restarts under it."""
    s = connection.settings_dict
    where = {"dbname": s["NAME"], "host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432,
             "user": s["USER"]}  # fmt: skip
    with psycopg.connect(**where, autocommit=True) as victim, \
            psycopg.connect(**where, autocommit=True) as admin:  # fmt: skip
        admin.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError) as gone:
            victim.execute("SELECT 1")
    response = exception_handler(gone.value, {})
    assert response is not None and response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.data == {"detail": DOWN_DETAIL}


def test_a_full_database_disk_is_answered_503_saying_so() -> None:
    response = exception_handler(errors.DiskFull("could not extend file: No space left"), {})
    assert response is not None and response.status_code == 503
    assert response.data == {"detail": FULL_DETAIL}
    assert "disk full" in FULL_DETAIL


def test_a_transaction_that_lost_a_deadlock_is_answered_503_to_retry(db: None) -> None:
    """The error PostgreSQL really gives the loser of a deadlock (two sessions each holding a
    row the other wants): rolled back whole, so the client is told to retry, not a 500."""
    s = connection.settings_dict
    where = {"dbname": s["NAME"], "host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432,
             "user": s["USER"]}  # fmt: skip
    table = f"berth_test_deadlock_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**where, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        admin.execute(f"INSERT INTO {table} VALUES (1), (2)")
        try:
            lost = _deadlock(where, table)
        finally:
            admin.execute(f"DROP TABLE {table}")
    assert lost.sqlstate == "40P01"
    response = exception_handler(lost, {})
    assert response is not None and response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.data == {"detail": CONFLICT_DETAIL}


def _deadlock(where: dict[str, object], table: str) -> psycopg.Error:
    """Two sessions lock rows 1 and 2 in opposite orders; the error of the one that lost."""
    both_hold = threading.Barrier(2)
    lost: list[psycopg.Error] = []

    def lock(first: int, second: int) -> None:
        with psycopg.connect(**where) as conn:  # type: ignore[arg-type]
            conn.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", (first,))
            both_hold.wait(timeout=10)
            try:
                conn.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", (second,))
            except psycopg.Error as exc:
                lost.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(lost) == 1, lost
    return lost[0]
