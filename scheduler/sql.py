"""Every statement Berth writes by hand, in one module: nothing else opens a cursor
(tests/architecture/test_layers.py refuses `connection.cursor` elsewhere), and
tests/app/test_sql.py proves each statement writes or reads the same rows as the ORM would.

Why by hand: the ORM has no cheap way to give each row its own value (a CASE WHEN per row
costs Django more to build than the database to run), to say which rows an insert skipped,
to make many near-identical rows in the database, or to write a job with its tasks and
events in one statement; and a statement every request runs (sign-in, a queue by name, a
node by token) costs an ORM compilation each time. Values are always prepared by the model
fields themselves (`pre_save`, `get_db_prep_save`; `from_db_value` on the way back), as the
ORM would, so defaults, `auto_now_add`, JSON and type checks are the same.

- Set-based writes, a thousand rows per statement (the scheduler cycle's, the agents'
  reports' and leases'): `update_rows` (UPDATE ... FROM (VALUES ...) RETURNING the rows that
  matched their guards) and `insert_new` (INSERT ... ON CONFLICT DO NOTHING RETURNING the
  rows that landed), in SQL that PostgreSQL and SQLite 3.35+ both read.
- Rows read by a unique column, written once per model (PostgreSQL; elsewhere the ORM):
  `row_by`, and `token_with_user` for sign-in; a lease's task rows, `lease_rows`.
- Rows the database makes (PostgreSQL): `insert_select` (INSERT ... SELECT over a row source:
  an array's elements and their tasks, `insert_array_elements`) and `write_job` (a job, its
  tasks and events in one WITH statement). Elsewhere the ORM writes the same rows.
- Transaction and lock statements (PostgreSQL only; nothing to do elsewhere): the snapshot's
  `repeatable_read`, the cycle's `take_change_marks`, a submission's `advisory_xact_lock`,
  the leader's lock statements (on its own connection), `leader_lock_granted` and
  `limit_idle_transactions`; the loop's connections apart from Django's (`connect_apart`:
  the leader's lock, the wake-up listener) and `LISTEN_WAKE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

import psycopg
from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.db.models import Field, Model

from scheduler.models import Event, Job, Task
from scheduler.states.names import TASK_ON_NODE

T = TypeVar("T")
CHUNK = 1000  # rows per statement: well inside every backend's parameter limit


def chunks(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


def _prep(field: Field[Any, Any], value: Any) -> Any:
    return field.get_db_prep_save(value, connection)


def _values_row(fields: Sequence[Field[Any, Any]], typed: bool) -> str:
    """A VALUES row of placeholders: the pk, then `fields`. On PostgreSQL the first row says
    each column's type, so a column of NULLs only (or of untyped literals) is still of the
    field's type, not text; SQLite needs no types."""
    marks = ["%s"]
    for field in fields:
        db_type = field.db_type(connection) if typed else None
        # The type without its length or precision: an explicit cast to varchar(n) would cut
        # an over-long first value silently, where the column refuses it from any other row.
        base = db_type.split("(", 1)[0].strip() if db_type else None
        marks.append(f"CAST(%s AS {base})" if base else "%s")
    return f"({', '.join(marks)})"


def _assign_from_values(table: str, field: Field[Any, Any], column: int, keep: bool) -> str:
    """`field = v.columnN`, or only where the row's own value is NULL when `keep`."""
    name = connection.ops.quote_name(field.column)
    value = f"v.column{column}"
    return f"{name} = COALESCE({table}.{name}, {value})" if keep else f"{name} = {value}"


def update_rows(
    model: type[Model],
    rows: Mapping[int, Sequence[Any]],
    per_row: Sequence[str],
    constants: Mapping[str, Any] | None = None,
    guards: Mapping[str, Any] | None = None,
    raw: Sequence[str] = (),
    keep: Sequence[str] = (),
) -> set[int]:
    """Set `per_row` fields from `rows` (pk -> values in that order) and `constants` on the
    rows whose `guards` fields still hold those values; returns the pks updated. `raw` adds
    SQL assignments that read only the row itself (e.g. a CASE on its own state). A `per_row`
    field also in `keep` is written only where the row's own value is NULL."""
    if not rows:
        return set()
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk_column = quote(model._meta.pk.column)  # type: ignore[union-attr]
    row_fields = [_field(model, name) for name in per_row]
    const_fields = [(_field(model, name), value) for name, value in (constants or {}).items()]
    guard_fields = [(_field(model, name), value) for name, value in (guards or {}).items()]
    assignments = [
        _assign_from_values(table, f, i + 2, f.name in keep) for i, f in enumerate(row_fields)
    ]
    assignments += [f"{quote(f.column)} = %s" for f, _ in const_fields]
    assignments += list(raw)
    conditions = "".join(f" AND {table}.{quote(f.column)} = %s" for f, _ in guard_fields)
    const_params = [_prep(f, v) for f, v in const_fields]
    guard_params = [_prep(f, v) for f, v in guard_fields]
    first = _values_row(row_fields, typed=connection.vendor == "postgresql")
    placeholder = _values_row(row_fields, typed=False)
    updated: set[int] = set()
    with connection.cursor() as cursor:
        for batch in chunks(sorted(rows.items())):
            values = [
                x
                for pk, vals in batch
                for x in (pk, *(_prep(f, v) for f, v in zip(row_fields, vals, strict=True)))
            ]
            cursor.execute(
                f"UPDATE {table} SET {', '.join(assignments)}"
                f" FROM (VALUES {', '.join([first] + [placeholder] * (len(batch) - 1))}) AS v"
                f" WHERE {table}.{pk_column} = v.column1{conditions}"
                f" RETURNING {table}.{pk_column}",
                [*const_params, *values, *guard_params],
            )
            updated.update(pk for (pk,) in cursor.fetchall())
    return updated


ModelT = TypeVar("ModelT", bound=Model)


def row_by(model: type[ModelT], column: str, value: Any, lock: bool = False) -> ModelT | None:
    """The row of `model` whose unique `column` (a field name) is `value`, or None; with
    `lock`, locked FOR UPDATE. On PostgreSQL the statement is written once per model and
    column: a row read on every request (a queue by name, a node by token) costs no ORM
    compilation. Other databases take the ORM's path, which converts their values."""
    if connection.vendor != "postgresql":
        rows = model._default_manager.filter(**{column: value})
        return (rows.select_for_update() if lock else rows).first()
    with connection.cursor() as cursor:
        cursor.execute(_row_sql(model, column) + (" FOR UPDATE" if lock else ""), [value])
        row = cursor.fetchone()
    if row is None:
        return None
    return from_row(model, row)


def from_row(model: type[ModelT], values: Sequence[Any]) -> ModelT:
    """A `model` instance from every column of its row, in the fields' order, as the ORM
    would make it: each field converts its own value (JSON is text until it does)."""
    fields = model._meta.concrete_fields
    converted = [
        f.from_db_value(v, None, connection) if hasattr(f, "from_db_value") else v
        for f, v in zip(fields, values, strict=True)
    ]
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


def row_columns(model: type[Model], alias: str = "") -> str:
    """Every column of `model`'s rows, quoted (each `alias.`-prefixed if given), in the order
    `from_row` takes them."""
    quote = connection.ops.quote_name
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + quote(f.column) for f in model._meta.concrete_fields)


def column_of(model: type[Model], name: str) -> str:
    """The quoted column of `model`'s field `name`."""
    return connection.ops.quote_name(_field(model, name).column)


@cache
def _row_sql(model: type[Model], column: str) -> str:
    table = connection.ops.quote_name(model._meta.db_table)
    return f"SELECT {row_columns(model)} FROM {table} WHERE {column_of(model, column)} = %s"


def insert_new(
    model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]]
) -> set[tuple[Any, ...]]:
    """Insert `rows` (values of `fields`), skipping those that break a unique constraint;
    returns the rows that landed, as tuples of the same fields."""
    if not rows:
        return set()
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    model_fields = [_field(model, name) for name in fields]
    columns = ", ".join(quote(f.column) for f in model_fields)
    placeholder = "(" + ", ".join(["%s"] * len(fields)) + ")"
    landed: set[tuple[Any, ...]] = set()
    with connection.cursor() as cursor:
        for batch in chunks(rows):
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([placeholder] * len(batch))}"
                f" ON CONFLICT DO NOTHING RETURNING {columns}",
                [_prep(f, v) for row in batch for f, v in zip(model_fields, row, strict=True)],
            )
            landed.update(tuple(r) for r in cursor.fetchall())
    return landed


# --- rows the database makes ------------------------------------------------------------


def insert_select(
    template: models.Model,
    varying: dict[str, tuple[str, list[Any]]],
    source: str,
    source_params: list[Any],
) -> int:
    """INSERT one row of `template`'s model per row of `source` (a FROM clause and what
    follows); columns named in `varying` (by attname) take their SQL expression, every other
    column `template`'s value. Returns the number of rows inserted."""
    model = type(template)
    quote = connection.ops.quote_name
    columns, expressions, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(quote(field.column))
        if field.attname in varying:
            sql, extra = varying[field.attname]
            expressions.append(sql)
            params.extend(extra)
            continue
        value = field.get_db_prep_save(field.pre_save(template, add=True), connection)
        # A typed placeholder: an untyped NULL or literal in a SELECT list is read as text.
        db_type = field.db_type(connection)
        expressions.append(f"%s::{db_type}" if db_type else "%s")
        params.append(value)
    table = quote(model._meta.db_table)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(expressions)} FROM {source}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *source_params])
        return int(cursor.rowcount)


JOB_ID = "(SELECT id FROM j)"  # the new job's id, inside the statement


def write_job(
    job: Job, tasks: list[Task], events: list[Event], *, in_one_statement: bool | None = None
) -> None:
    """Insert the unsaved `job`, then `tasks` and `events` (all of `job`), atomically; sets
    the job's and the tasks' primary keys, as `save()` and `bulk_create` would. In one
    statement on PostgreSQL (`in_one_statement` None), else through the ORM."""
    if in_one_statement is None:
        in_one_statement = connection.vendor == "postgresql"
    if not in_one_statement:
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


def insert_array_elements(
    element: Job,
    indices: Sequence[int],
    released: int,
    held: str,
    groups: Iterable[tuple[str, int, int, int, dict[str, Any]]],
) -> None:
    """One job like `element` per index (the first `released` free, the rest with
    `hold_reason` `held`), then each one's tasks: `groups` are (name, replicas, cpu, memory,
    gpu). Two kinds of INSERT ... SELECT: the elements over unnest(indices), the tasks over
    the new elements joined to generate_series(replicas)."""
    insert_select(
        element,
        {"array_index": ("t.idx", []),
         "hold_reason": ("CASE WHEN t.ord > %s THEN %s ELSE '' END", [released, held])},
        "unnest(%s::integer[]) WITH ORDINALITY AS t(idx, ord)", [list(indices)],
    )  # fmt: skip
    jobs = connection.ops.quote_name(Job._meta.db_table)
    for name, replicas, cpu, memory, gpu in groups:  # gpu: the GPU columns
        insert_select(
            Task(job_id=0, group=name, index=0, cpu=cpu, memory=memory, **gpu),
            {"job_id": ("j.id", []), "index": ("r.i", [])},
            f"{jobs} AS j CROSS JOIN generate_series(0, %s) AS r(i)"
            " WHERE j.array_parent_id = %s ORDER BY j.id, r.i",
            [replicas - 1, element.array_parent_id],
        )  # fmt: skip


# --- a lease's tasks ---------------------------------------------------------------------


LEASE_COLUMNS = ("id", "node_id", "attempt", "state", "kill_requested")


def lease_rows(node_id: int, reported: Sequence[int]) -> list[tuple[Any, ...]]:
    """(LEASE_COLUMNS) of the tasks on node `node_id` (in a state that holds it) and of those
    `reported` by its agent: every lease reads them, so the statement is written here rather
    than built by the ORM each time."""
    quote = connection.ops.quote_name
    on_node = ", ".join(["%s"] * len(TASK_ON_NODE))
    sql = (
        f"SELECT {', '.join(quote(c) for c in LEASE_COLUMNS)} FROM {quote(Task._meta.db_table)}"
        f" WHERE ({quote('node_id')} = %s AND {quote('state')} IN ({on_node}))"
    )
    if reported:
        sql += f" OR {quote('id')} IN ({', '.join(['%s'] * len(reported))})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [node_id, *TASK_ON_NODE, *reported])
        return cursor.fetchall()


# --- sign-in -------------------------------------------------------------------------------


def token_with_user(model: type[ModelT], column: str, value: str) -> ModelT | None:
    """The token row of `model` whose unique `column` is `value`, with its `user` loaded, in
    one query. Every API request signs in, so on PostgreSQL the statement is written once per
    model and column (the ORM would compile it each time, ~0.5 ms of a web worker's CPU);
    other databases take the ORM's path, which converts their values."""
    if connection.vendor != "postgresql":
        return model._default_manager.select_related("user").filter(**{column: value}).first()
    sql, width = _signin_sql(model, column)
    with connection.cursor() as cursor:
        cursor.execute(sql, [value])
        row = cursor.fetchone()
    if row is None:
        return None
    token = from_row(model, row[:width])
    setattr(token, "user", from_row(get_user_model(), row[width:]))  # noqa: B010 - any token model
    return token


@cache
def _signin_sql(model: type[Model], column: str) -> tuple[str, int]:
    """SELECT every column of a token row found by `column`, then every column of its user;
    and how many columns are the token's."""
    quote = connection.ops.quote_name
    user_model = get_user_model()
    user_pk = user_model._meta.pk
    assert user_pk is not None
    sql = (
        f"SELECT {row_columns(model, 't')}, {row_columns(user_model, 'u')}"
        f" FROM {quote(model._meta.db_table)} t JOIN {quote(user_model._meta.db_table)} u"
        f" ON u.{column_of(user_model, user_pk.name)} = t.{column_of(model, 'user')}"
        f" WHERE t.{column_of(model, column)} = %s"
    )
    return sql, len(model._meta.concrete_fields)


# --- transactions and locks (PostgreSQL) ---------------------------------------------------


def repeatable_read() -> None:
    """The current transaction, before its first read, sees one snapshot of every table."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def take_change_marks() -> bool:
    """Delete the change marks (scheduler/migrations/0014_change_marks.py) in a statement of
    its own; True if there were any. True where the database keeps no marks (SQLite)."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:  # autocommit: its own transaction
        cursor.execute("DELETE FROM berth_change")
        return cursor.rowcount != 0


def advisory_xact_lock(first: int, second: int) -> None:
    """Take the two-key advisory lock (first, second) until the transaction ends (apart from
    the leader's one-key lock)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s::int, %s::int)", [first, second])


# The leader's lock, on a psycopg connection of its own (scheduler/cycle/leader.py): a session-level
# advisory lock, kept busy while it leads, asked about, and let go.
LEADER_TRY_LOCK = "SELECT pg_try_advisory_lock(%s), pg_backend_pid()"
PING = "SELECT 1"
LEADER_LOCK_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND objid = %s"
)
LEADER_UNLOCK = "SELECT pg_advisory_unlock(%s)"
# The loop's wake-ups (scheduler/cycle/wakeup.py): triggers notify this channel when news for
# the scheduler commits (scheduler/migrations/0025_wake_scheduler.py); the loop listens.
WAKE_CHANNEL = "berth_wake"
LISTEN_WAKE = f"LISTEN {WAKE_CHANNEL}"


def quiet_session(quiet: bool) -> None:
    """Say whether this session's writes are news for the loop (the wake-up triggers skip a
    quiet session). Session-wide, so it must be said again before the connection is pooled."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('berth.quiet', %s, false)", ["on" if quiet else ""])


def connect_apart(
    settings_dict: Mapping[str, Any],
    application_name: str,
    timeout: float,
    options: str | None = None,
) -> psycopg.Connection[Any]:
    """A psycopg connection of the loop's own, apart from Django's pool, in autocommit; a
    server that vanished is noticed by the kernel's keepalives within about `timeout`, not
    after TCP's two hours."""
    s = settings_dict
    return psycopg.connect(
        dbname=s["NAME"],
        user=s.get("USER") or None,
        password=s.get("PASSWORD") or None,
        host=s.get("HOST") or None,
        port=s.get("PORT") or None,
        autocommit=True,
        application_name=application_name,
        connect_timeout=max(1, int(timeout)),
        options=options,
        keepalives=1,
        keepalives_idle=max(1, int(timeout / 3)),
        keepalives_interval=max(1, int(timeout / 6)),
        keepalives_count=3,
    )


def leader_lock_granted(pid: int, objid: int) -> bool:
    """Does the session `pid` hold the advisory lock `objid` (its low 32 bits)?"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = %s AND objid = %s",
            (pid, objid),
        )
        return cursor.fetchone() is not None


def limit_idle_transactions(db: Any, milliseconds: int) -> None:
    """On the Django connection `db` (PostgreSQL), end a transaction idle for longer."""
    if db.vendor == "postgresql":
        with db.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {int(milliseconds)}")


def guard_state_moves(db: Any) -> list[str]:
    """On the Django connection `db` (PostgreSQL), make the database refuse every state move
    that no state machine allows (scheduler/states/), whichever code writes it: one BEFORE
    UPDATE trigger per state column. The test suite installs it in its database, so every
    writer the tests reach, set-based or not, is checked against the tables. Returns the
    guarded columns."""
    from scheduler.models import Flow, FlowStep, Node
    from scheduler.states import flow, job, node, task
    from scheduler.states.machine import Machine

    guarded: list[tuple[type[Model], str, Machine[Any, Any]]] = [
        (Job, "state", job.MACHINE),
        (Task, "state", task.MACHINE),
        (Flow, "state", flow.FLOW),
        (FlowStep, "state", flow.STEP),
        (Node, "state", node.SHOWN),
        (Node, "admin_state", node.ADMIN),
    ]
    names = []
    with db.cursor() as cursor:
        for model, column, machine in guarded:
            table = model._meta.db_table
            name = f"berth_guard_{table}_{column}"
            moves = ", ".join(f"'{old}>{new}'" for old, new in sorted(machine.allowed_moves()))
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN"
                f" IF NEW.{column} IS DISTINCT FROM OLD.{column}"
                f" AND NOT (OLD.{column} || '>' || NEW.{column} = ANY (ARRAY[{moves}])) THEN"
                f" RAISE EXCEPTION 'illegal {machine.kind} move: % -> % (id %)',"
                f" OLD.{column}, NEW.{column}, OLD.id; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE UPDATE OF {column} ON {table}"
                f" FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
            names.append(f"{table}.{column}")
    return names
