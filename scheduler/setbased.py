"""Set-based writes for the scheduler cycle, a thousand rows per statement.

`row_by` reads one row by a unique column with a statement written once (PostgreSQL).

The ORM has no cheap way to give each row its own value (a CASE WHEN per row costs Django
more to build than the database to run) nor to say which rows an insert skipped, so these two
statements are written by hand, in SQL that PostgreSQL and SQLite 3.35+ both read:

- `update_rows`: UPDATE ... SET col = v.columnN FROM (VALUES (pk, ...), ...) AS v
  WHERE pk = v.column1 [AND guards] RETURNING pk — the rows that matched the guards;
- `insert_new`: INSERT ... ON CONFLICT DO NOTHING RETURNING ... — the rows that landed.

Values are prepared by the model fields themselves (`get_db_prep_save`), as the ORM would.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

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


def update_rows(
    model: type[Model],
    rows: Mapping[int, Sequence[Any]],
    per_row: Sequence[str],
    constants: Mapping[str, Any] | None = None,
    guards: Mapping[str, Any] | None = None,
    raw: Sequence[str] = (),
) -> set[int]:
    """Set `per_row` fields from `rows` (pk -> values in that order) and `constants` on the
    rows whose `guards` fields still hold those values; returns the pks updated. `raw` adds
    SQL assignments that read only the row itself (e.g. a CASE on its own state)."""
    if not rows:
        return set()
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk_column = quote(model._meta.pk.column)  # type: ignore[union-attr]
    row_fields = [_field(model, name) for name in per_row]
    const_fields = [(_field(model, name), value) for name, value in (constants or {}).items()]
    guard_fields = [(_field(model, name), value) for name, value in (guards or {}).items()]
    assignments = [f"{quote(f.column)} = v.column{i + 2}" for i, f in enumerate(row_fields)]
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
