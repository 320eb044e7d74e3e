"""News wakes the scheduler loop before its interval is over (scheduler/cycle/wakeup.py).

On PostgreSQL the news comes from triggers (scheduler/migrations/0025_wake_scheduler.py) as
notifications, delivered at commit: these tests commit for real (transactional tests) and
listen on a connection of the loop's own, as the loop does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction

from scheduler import notify, sql
from scheduler.cycle import wakeup as wakeup_module
from scheduler.cycle.leader import leader_lock
from scheduler.cycle.loop import run_scheduler_cycle
from scheduler.cycle.wakeup import Wakeup
from scheduler.models import Job, SchedulerHeartbeat, Task
from scheduler.states.names import JobRequest, TaskState
from tests.factories import make_job, make_node

pytestmark = pytest.mark.django_db(transaction=True)

NEWS = 20.0  # a wait that news ends early; it runs out only if the news never comes
QUIET = 0.5  # a wait that should run out: no news


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the wake-up triggers are PostgreSQL's")


@pytest.fixture
def wakeup(postgresql: None) -> Any:
    waker = Wakeup(gap=0.0)
    stop = threading.Event()
    # Listening from now on; what committed before was announced to nobody, so a fresh
    # listener is news (the loop then runs a cycle at once).
    assert waker.wait(0.01, stop) is True
    yield waker
    waker.close()


def test_a_submission_wakes_the_loop_and_nothing_else_does(wakeup, owner) -> None:
    stop = threading.Event()
    assert wakeup.wait(QUIET, stop) is False
    make_job(owner, gpu=1)
    assert wakeup.wait(NEWS, stop) is True
    assert wakeup.wait(QUIET, stop) is False  # one commit, one wake-up


def test_a_task_that_starts_wakes_it_and_other_task_writes_do_not(wakeup, owner) -> None:
    stop = threading.Event()
    with transaction.atomic():  # one commit: one notification
        job = make_job(owner)
        Task.objects.filter(job=job).update(state=TaskState.ASSIGNED)
    assert wakeup.wait(NEWS, stop) is True
    assert wakeup.wait(QUIET, stop) is False
    Task.objects.filter(job=job).update(exit_code=3)  # no state moved: not news
    assert wakeup.wait(QUIET, stop) is False
    Task.objects.filter(job=job).update(state=TaskState.RUNNING)
    assert wakeup.wait(NEWS, stop) is True


def test_a_users_request_wakes_it(wakeup, owner) -> None:
    stop = threading.Event()
    job = make_job(owner)
    assert wakeup.wait(NEWS, stop) is True
    Job.objects.filter(pk=job.pk).update(requested_action=JobRequest.CANCEL)
    assert wakeup.wait(NEWS, stop) is True


def test_the_cycles_own_writes_do_not_wake_it_and_its_session_is_loud_again(wakeup, owner) -> None:
    stop = threading.Event()
    with transaction.atomic():
        make_node("gpu-1", gpus=1)
        job = make_job(owner, gpu=1)
    assert wakeup.wait(NEWS, stop) is True
    assert wakeup.wait(QUIET, stop) is False
    run_scheduler_cycle()  # places the job: its task moves, on a quiet session
    assert Task.objects.get(job=job).state == TaskState.ASSIGNED
    assert wakeup.wait(QUIET, stop) is False
    # The same connection, back from the cycle (as a pooled one goes to a request next):
    Task.objects.filter(job=job).update(state=TaskState.RUNNING)
    assert wakeup.wait(NEWS, stop) is True


def test_a_rolled_back_submission_wakes_nothing(wakeup, owner) -> None:
    stop = threading.Event()
    with pytest.raises(RuntimeError), transaction.atomic():
        make_job(owner)
        raise RuntimeError("the request failed")
    assert wakeup.wait(QUIET, stop) is False


def test_a_lost_listening_connection_is_replaced(wakeup, owner, monkeypatch) -> None:
    monkeypatch.setattr(wakeup_module, "RECONNECT_SECONDS", 0.0)
    stop = threading.Event()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
            " current_database() AND application_name = 'berth-scheduler-wakeup'"
        )
        assert cursor.fetchone() == (True,)
    assert wakeup.wait(QUIET, stop) is False  # the loss is noticed, not raised
    assert wakeup.wait(0.01, stop) is True  # listening again: what it missed is news
    assert wakeup.wait(QUIET, stop) is False
    make_job(owner)
    assert wakeup.wait(NEWS, stop) is True


def test_the_triggers_notify_the_channel_the_loop_listens_on() -> None:
    from importlib import import_module

    migration = import_module("scheduler.migrations.0025_wake_scheduler")
    assert migration.CHANNEL == sql.WAKE_CHANNEL


def test_in_process_news_is_a_change_another_thread_commits(db) -> None:
    waker = Wakeup(gap=0.0, in_process=True)
    stop = threading.Event()
    try:
        notify.changed(jobs=[1])  # the loop's own thread: not news
        assert waker.wait(QUIET, stop) is False
        other = threading.Thread(target=lambda: notify.changed(jobs=[1]))
        other.start()
        other.join()
        assert waker.wait(NEWS, stop) is True
    finally:
        waker.close()
        connections.close_all()


def test_a_wakeup_waits_the_gap_and_a_stop_ends_the_wait(db) -> None:
    waker = Wakeup(gap=0.3, in_process=True)
    stop = threading.Event()
    try:
        other = threading.Thread(target=lambda: notify.changed(jobs=[1]))
        other.start()
        other.join()
        began = time.monotonic()
        assert waker.wait(NEWS, stop) is True
        assert time.monotonic() - began >= 0.3  # never sooner than the gap
        stop.set()
        assert waker.wait(NEWS, stop) is False
    finally:
        waker.close()


def test_a_commit_before_the_listener_opens_is_not_missed(postgresql, owner) -> None:
    """The loop's first cycle reads the database before its first wait opens the listener:
    a submission committed in between notified nobody (CI saw that job wait the whole
    interval). A fresh listener is news: the loop runs a cycle after the gap."""
    waker = Wakeup(gap=0.0)
    stop = threading.Event()
    try:
        make_job(owner)  # after the cycle's reads, before anyone listens
        assert waker.wait(QUIET, stop) is True
        assert waker.wait(QUIET, stop) is False  # listening now: no news since
    finally:
        waker.close()


def test_the_loop_places_a_job_submitted_long_before_its_next_interval(
    postgresql, owner, settings
) -> None:
    from scheduler.management.commands import run_scheduler

    settings.BERTH_SCHEDULER_WAKE_GAP = 0.0
    make_node("gpu-1", gpus=1)
    stop = threading.Event()
    lock = leader_lock()
    loop = threading.Thread(target=run_scheduler.run_loop, args=(lock, 60.0, stop, False))
    loop.start()
    try:
        _until(lambda: SchedulerHeartbeat.objects.exists())  # its first cycle ran
        job = make_job(owner, gpu=1)
        placed = _until(lambda: Task.objects.get(job=job).state == TaskState.ASSIGNED)
        assert placed, "the job waited for the loop's next interval (60 s)"
    finally:
        stop.set()
        loop.join(timeout=30)
        lock.release()
    assert not loop.is_alive()


def _until(condition: Any, seconds: float = NEWS) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_standby_does_not_listen(wakeup, owner) -> None:
    """Notifications a session never reads pile up on the server: a loop that does not lead
    closes its listener, and opens a new one when it waits as the leader again."""

    def listening() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'berth-scheduler-wakeup'"
            )
            return int(cursor.fetchone()[0])

    stop = threading.Event()
    assert listening() == 1
    wakeup.pause()
    assert _until(lambda: listening() == 0)
    assert wakeup.wait(0.01, stop) is True  # leading again: listening, news missed meanwhile
    assert wakeup.wait(QUIET, stop) is False
    make_job(owner)
    assert wakeup.wait(NEWS, stop) is True
