"""Many near-identical rows in one statement: INSERT ... SELECT on PostgreSQL.

`bulk_create` sends every value of every row from Python; for 10,000 array elements of ~40
columns that is 400,000 parameters to prepare, quote and parse, and it measured under 2,000
elements/s here. When rows differ only in a few columns, PostgreSQL can make them itself:
the shared values are sent once, the differing columns are SQL over a row source
(`unnest(...)`, `generate_series(...)`, a join). The shared values come from an unsaved model
instance through each field's own `pre_save`/`get_db_prep_save`, so defaults, `auto_now_add`
and JSON encoding are exactly what `save()` would write, including for fields added later.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, models


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
