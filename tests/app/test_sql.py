"""Set-based writes: each row its own values in one statement, read back as the ORM wrote."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import Job, Task
from scheduler.sql import update_rows
from scheduler.states.names import TaskState
from tests.factories import make_job, seed

pytestmark = pytest.mark.django_db

COLUMNS = ["state", "exit_code", "started_at", "finished_at", "message"]


def test_each_row_takes_its_own_values_in_one_statement(owner):
    tasks = list(make_job(owner, replicas=3).tasks.order_by("pk"))
    seed(Task.objects.filter(pk__in=[t.pk for t in tasks[:2]]), state=TaskState.RUNNING)
    now = timezone.now()
    wanted = {
        tasks[0].pk: (TaskState.SUCCEEDED, 0, now - timedelta(seconds=5), now, ""),
        tasks[1].pk: (TaskState.FAILED, 3, now - timedelta(seconds=4), now, "it's 'quoted'"),
    }
    with CaptureQueriesContext(connection) as queries:
        updated = update_rows(Task, wanted, per_row=COLUMNS)
    assert updated == set(wanted)
    assert len(queries) == 1
    for task in Task.objects.filter(pk__in=wanted):
        assert tuple(getattr(task, c) for c in COLUMNS) == wanted[task.pk]
    untouched = Task.objects.get(pk=tasks[2].pk)
    assert (untouched.state, untouched.exit_code, untouched.finished_at) == (
        TaskState.PENDING, None, None,
    )  # fmt: skip


def test_a_column_of_nulls_only_keeps_its_type(owner):
    """On PostgreSQL an untyped NULL in VALUES is text, which an integer column refuses:
    tasks that all end without an exit code (lost, killed before they ran) must still be
    written."""
    tasks = list(make_job(owner, replicas=2).tasks.order_by("pk"))
    seed(Task.objects.filter(pk__in=[t.pk for t in tasks]), state=TaskState.RUNNING)
    now = timezone.now()
    rows = {t.pk: (TaskState.LOST, None, None, now, "agent no longer runs it") for t in tasks}
    assert update_rows(Task, rows, per_row=COLUMNS) == set(rows)
    for task in Task.objects.filter(pk__in=rows):
        assert (task.state, task.exit_code, task.started_at) == (TaskState.LOST, None, None)


def test_json_and_guards(owner):
    jobs = [make_job(owner, name=f"j{i}") for i in range(3)]
    reasons = {jobs[0].pk: ({"NodeFull": ["a", "b"]},), jobs[1].pk: ({},), jobs[2].pk: ({},)}
    Job.objects.filter(pk=jobs[2].pk).update(state="Running")
    updated = update_rows(
        Job, reasons, per_row=["pending_node_reasons"], guards={"state": "Pending"}
    )
    assert updated == {jobs[0].pk, jobs[1].pk}
    assert Job.objects.get(pk=jobs[0].pk).pending_node_reasons == {"NodeFull": ["a", "b"]}


def test_a_kept_column_is_written_only_where_the_row_has_none(owner):
    """`keep`: a start time already recorded stays; a missing one is filled (as the ORM's
    Coalesce(F(field), value) would)."""
    tasks = list(make_job(owner, replicas=2).tasks.order_by("pk"))
    earlier, now = timezone.now() - timedelta(minutes=5), timezone.now()
    seed(Task.objects.filter(pk=tasks[0].pk), state=TaskState.RUNNING, started_at=earlier)
    rows = {t.pk: (now, "kept") for t in tasks}
    assert update_rows(Task, rows, per_row=["started_at", "message"], keep=["started_at"]) == set(
        rows
    )
    first, second = Task.objects.filter(pk__in=rows).order_by("pk")
    assert (first.started_at, first.message) == (earlier, "kept")
    assert (second.started_at, second.message) == (now, "kept")


def test_row_by_reads_the_whole_row_the_orm_reads():
    from scheduler.models import Node, Queue
    from scheduler.sql import row_by
    from tests.factories import make_node

    node = make_node("gpu-1", gpus=2, labels={"zone": "a"})
    token = node.issue_token()
    node.save()
    found = row_by(Node, "token_hash", node.token_hash)
    expected = Node.objects.get(pk=node.pk)
    assert found is not None and token
    assert {f.attname: getattr(found, f.attname) for f in Node._meta.concrete_fields} == {
        f.attname: getattr(expected, f.attname) for f in Node._meta.concrete_fields
    }
    assert found._state.adding is False and found.labels == {"zone": "a"}
    assert row_by(Node, "token_hash", "no-such-hash") is None
    queue = Queue.objects.get_or_create(name="default")[0]
    assert row_by(Queue, "name", "default") == queue
    with transaction.atomic():
        locked = row_by(Node, "token_hash", node.token_hash, lock=True)
        assert locked == node


def test_an_over_long_value_is_refused_in_any_row_never_cut(owner):
    """The first VALUES row says each column's type, not its length: a value too long for
    its column is refused as in every other row, not silently cut to fit."""
    from django.db import DataError

    jobs = [make_job(owner, name=f"j{i}") for i in range(2)]
    rows = {jobs[0].pk: ("x" * 300,), jobs[1].pk: ("fits",)}
    with pytest.raises(DataError), transaction.atomic():
        update_rows(Job, rows, per_row=["hold_reason"])
    assert set(Job.objects.values_list("hold_reason", flat=True)) == {""}


# --- each statement of scheduler/sql.py against what the ORM writes or reads ----------------


def _row(obj: object, model: type, skip: tuple[str, ...] = ("id",)) -> dict[str, object]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in model._meta.concrete_fields  # type: ignore[attr-defined]
        if f.attname not in skip
    }


@pytest.mark.postgres
def test_write_job_in_one_statement_writes_the_rows_the_orm_writes(owner):
    from scheduler.models import Event, Queue
    from scheduler.sql import write_job

    queue = Queue.objects.get_or_create(name="default")[0]
    written = {}
    for one_statement in (True, False):
        job = Job(name="same", owner=owner, queue=queue, spec={"tasks": []}, walltime=60,
                  labels={"team": "a"})  # fmt: skip
        tasks = [Task(job=job, group="main", index=i, cpu=500, memory=2**20, gpu=i)
                 for i in range(3)]  # fmt: skip
        events = [Event(job=job, kind="JobSubmitted", reason="Submitted", message="3 tasks")]
        with CaptureQueriesContext(connection) as queries:
            write_job(job, tasks, events, in_one_statement=one_statement)
        if one_statement:
            assert len(queries) == 1
        assert job.pk and all(t.pk and t.job_id == job.pk for t in tasks)
        saved = Job.objects.get(pk=job.pk)
        written[one_statement] = (
            _row(saved, Job, skip=("id", "created_at", "updated_at")),
            [_row(t, Task, skip=("id", "job_id")) for t in saved.tasks.order_by("index")],
            [(e.kind, e.reason, e.message) for e in Event.objects.filter(job=saved)],
        )
    (job_a, tasks_a, events_a), (job_b, tasks_b, events_b) = written[True], written[False]
    assert {k: (v, job_b[k]) for k, v in job_a.items() if v != job_b[k]} == {}
    assert (tasks_a, events_a) == (tasks_b, events_b)


def test_insert_new_lands_what_bulk_create_would_and_skips_conflicts(owner):
    from scheduler.models import Allocation, Device
    from scheduler.sql import insert_new
    from tests.factories import make_node

    node = make_node("n1", gpus=2)
    devices = list(Device.objects.filter(node=node).order_by("index"))
    tasks = list(make_job(owner, replicas=2).tasks.order_by("pk"))
    Allocation.objects.create(task=tasks[0], device=devices[0])
    now = timezone.now()
    landed = insert_new(
        Allocation, ["task", "device", "created_at"],
        [(tasks[1].pk, devices[0].pk, now), (tasks[1].pk, devices[1].pk, now)],
    )  # fmt: skip
    assert landed == {(tasks[1].pk, devices[1].pk, now)}  # the taken device was skipped
    assert set(Allocation.objects.values_list("task_id", "device_id")) == {
        (tasks[0].pk, devices[0].pk), (tasks[1].pk, devices[1].pk),
    }  # fmt: skip


@pytest.mark.postgres
def test_token_with_user_reads_the_rows_the_orm_reads(owner):
    from rest_framework.authtoken.models import Token

    from scheduler.models import ApiToken
    from scheduler.ops.tokens import create_token
    from scheduler.sql import token_with_user

    _, key = create_token(owner, "ci")
    stored = ApiToken.objects.select_related("user").get(user=owner)
    found = token_with_user(ApiToken, "key_hash", stored.key_hash)
    assert found is not None and key
    assert _row(found, ApiToken, skip=()) == _row(stored, ApiToken, skip=())
    assert _row(found.user, type(owner), skip=()) == _row(stored.user, type(owner), skip=())
    legacy = Token.objects.create(user=owner)
    again = token_with_user(Token, "key", legacy.key)
    assert again is not None and again.user.pk == owner.pk
    assert token_with_user(Token, "key", "nope") is None


def test_lease_rows_reads_the_tasks_the_orm_reads(owner):
    from scheduler.sql import LEASE_COLUMNS, lease_rows
    from scheduler.states.names import TASK_ON_NODE
    from tests.factories import make_node

    node, other = make_node("n1"), make_node("n2")
    tasks = list(make_job(owner, replicas=4).tasks.order_by("pk"))
    seed(Task.objects.filter(pk=tasks[0].pk), node=node, state=TaskState.RUNNING)
    seed(Task.objects.filter(pk=tasks[1].pk), node=node, state=TaskState.SUCCEEDED)
    seed(Task.objects.filter(pk=tasks[2].pk), node=other, state=TaskState.RUNNING)
    for reported in ([], [tasks[1].pk], [tasks[2].pk, tasks[3].pk]):
        orm = Task.objects.filter(node=node, state__in=TASK_ON_NODE) | Task.objects.filter(
            pk__in=reported
        )
        expected = set(orm.values_list(*LEASE_COLUMNS))
        assert set(lease_rows(node.pk, reported)) == expected


@pytest.mark.postgres
def test_change_marks_are_taken_once():
    from scheduler.models import Queue
    from scheduler.sql import take_change_marks

    take_change_marks()
    assert take_change_marks() is False
    Queue.objects.create(name="marks")  # a table the cycle reads: its trigger leaves a mark
    assert take_change_marks() is True
    assert take_change_marks() is False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_transaction_and_lock_statements_do_what_they_say():
    from scheduler.sql import advisory_xact_lock, limit_idle_transactions, repeatable_read

    with transaction.atomic(), connection.cursor() as cursor:
        repeatable_read()
        cursor.execute("SHOW transaction_isolation")
        assert cursor.fetchone() == ("repeatable read",)
        advisory_xact_lock(7, 9)
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND classid = 7 AND objid = 9"
        )
        assert cursor.fetchone() == (1,)
    limit_idle_transactions(connection, 4321)
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone() == ("4321ms",)
        cursor.execute("SET idle_in_transaction_session_timeout = 0")
