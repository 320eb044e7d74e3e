"""A new job, its tasks and its events written in one statement on PostgreSQL.

A submission used to be five statements (BEGIN, the job's INSERT, the tasks', the event's,
COMMIT), each a round trip and each an ORM compilation. PostgreSQL runs data-modifying
statements in WITH exactly once and as one statement, so one INSERT of the job feeding the
INSERTs of its tasks and events writes the same rows atomically without a transaction
block. Every value comes from the unsaved instances through each field's own
`pre_save`/`get_db_prep_save`, as `save()` and `bulk_create` do (defaults, `auto_now_add`,
JSON), and goes through plain VALUES, so each column takes its own type and length checks
exactly as before. Other databases (SQLite, embedded) take the ORM's path: the same rows.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection, models, transaction

from scheduler.models import Event, Job, Task

JOB_ID = "(SELECT id FROM j)"  # the new job's id, inside the statement


def write_job(job: Job, tasks: list[Task], events: list[Event]) -> None:
    """Insert the unsaved `job`, then `tasks` and `events` (all of `job`), atomically; sets
    the job's and the tasks' primary keys, as `save()` and `bulk_create` would."""
    if connection.vendor != "postgresql":
        with transaction.atomic():
            job.save(force_insert=True)
            for task in tasks:
                task.job = job
            for event in events:
                event.job = job
            Task.objects.bulk_create(tasks)
            Event.objects.bulk_create(events)
        return
    job_sql, params = _insert(Job, [job], link=None)
    task_sql, task_params = _insert(Task, tasks, link="job_id")
    event_sql, event_params = _insert(Event, events, link="job_id")
    quote = connection.ops.quote_name
    sql = (
        f"WITH j AS ({job_sql} RETURNING id),"
        f" t AS ({task_sql} RETURNING id, {quote('group')}, {quote('index')}),"
        f" e AS ({event_sql} RETURNING id)"
        f" SELECT {JOB_ID}, t.id, t.{quote('group')}, t.{quote('index')} FROM t"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *task_params, *event_params])
        rows = cursor.fetchall()
    _saved(job, rows[0][0])
    ids = {(group, index): pk for _, pk, group, index in rows}
    for task in tasks:
        task.job = job
        _saved(task, ids[(task.group, task.index)])
    for event in events:
        event.job = job  # its id is not read back: nothing shows it


def _saved(row: models.Model, pk: int) -> None:
    row.pk = pk
    row._state.adding = False
    row._state.db = connection.alias


@cache
def _columns(model: type[models.Model]) -> tuple[str, tuple[Any, ...]]:
    """`INSERT INTO table (columns)` of `model` and its fields, in the same order."""
    quote = connection.ops.quote_name
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    names = ", ".join(quote(f.column) for f in fields)
    return f"INSERT INTO {quote(model._meta.db_table)} ({names})", fields


def _insert(model: type[models.Model], rows: list[Any], link: str | None) -> tuple[str, list[Any]]:
    """An INSERT of `rows` with its parameters; the field named `link` (an attname) takes
    the new job's id."""
    head, fields = _columns(model)
    values, params = [], []
    for row in rows:
        marks = []
        for field in fields:
            if field.attname == link:
                marks.append(JOB_ID)
                continue
            value = field.get_db_prep_save(field.pre_save(row, add=True), connection)
            if value is None:  # fewer parameters: psycopg caches the parsing of a query
                marks.append("NULL")  # of at most 50 (a new job's ~20 empty columns)
                continue
            marks.append("%s")
            params.append(value)
        values.append(f"({', '.join(marks)})")
    return f"{head} VALUES {', '.join(values)}", params
