"""Change marks for the scheduler loop (PostgreSQL only; SQLite keeps none).

Every write to a table the scheduler cycle reads adds one row to the unlogged table
`berth_change` (statement-level triggers, so a bulk insert of 10,000 tasks adds one row; for
nodes and devices only writes to what the cycle reads count, so lease renewals add none). The
loop deletes the marks at the start of each cycle and skips a cycle that found none and has
no housekeeping due (scheduler/cycle/loop.py). A mark is a row, not a counter: a writer never waits
for another, and a mark whose transaction commits after the loop's DELETE stays for the next
cycle, so no change is ever lost. Unlogged: a crash empties it, and the loop runs a full cycle
after any failure and at least once a second anyway.
"""

from typing import Any

from django.db import migrations

# Tables where any write matters to the cycle.
WATCHED = (
    "scheduler_job",
    "scheduler_task",
    "scheduler_allocation",
    "scheduler_queue",
    "scheduler_flow",
    "scheduler_flowstep",
    "scheduler_node",
    "scheduler_device",
)
# Tables with frequent writes to columns the cycle never reads: only these columns count.
UPDATED_COLUMNS = {
    "scheduler_node": ("name", "cpu", "memory", "labels", "state"),
    "scheduler_device": ("node_id", "index", "uuid", "model", "healthy"),
}

CREATE = [
    "CREATE UNLOGGED TABLE berth_change (id bigserial)",
    """CREATE FUNCTION berth_note_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO berth_change DEFAULT VALUES;
        RETURN NULL;
    END $$""",
]


def _triggers(table: str) -> list[str]:
    columns = UPDATED_COLUMNS.get(table)
    if columns is None:
        return [
            f"CREATE TRIGGER berth_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION berth_note_change()"
        ]
    old = ", ".join(f'OLD."{c}"' for c in columns)
    new = ", ".join(f'NEW."{c}"' for c in columns)
    return [
        f"CREATE TRIGGER berth_change AFTER INSERT OR DELETE OR TRUNCATE ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION berth_note_change()",
        f"CREATE TRIGGER berth_change_update AFTER UPDATE ON {table} FOR EACH ROW"
        f" WHEN (({old}) IS DISTINCT FROM ({new})) EXECUTE FUNCTION berth_note_change()",
    ]


def create_marks(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in CREATE + [t for table in WATCHED for t in _triggers(table)]:
        schema_editor.execute(statement)


def drop_marks(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in WATCHED:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS berth_change ON {table}")
        schema_editor.execute(f"DROP TRIGGER IF EXISTS berth_change_update ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS berth_note_change()")
    schema_editor.execute("DROP TABLE IF EXISTS berth_change")


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0013_spec")]

    operations = [migrations.RunPython(create_marks, drop_marks)]
