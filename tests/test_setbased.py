"""Set-based writes: each row its own values in one statement, read back as the ORM wrote."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import Job, Task
from scheduler.setbased import update_rows
from scheduler.states import TaskState
from tests.factories import make_job

pytestmark = pytest.mark.django_db

COLUMNS = ["state", "exit_code", "started_at", "finished_at", "message"]


def test_each_row_takes_its_own_values_in_one_statement(owner):
    tasks = list(make_job(owner, replicas=3).tasks.order_by("pk"))
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


def test_row_by_reads_the_whole_row_the_orm_reads():
    from scheduler.models import Node, Queue
    from scheduler.setbased import row_by
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
