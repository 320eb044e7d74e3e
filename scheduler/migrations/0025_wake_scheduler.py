"""Wake the scheduler loop when news for it commits (PostgreSQL only; scheduler/cycle/wakeup.py).

News is: a job or a flow submitted, a user's request on a job (cancel, suspend, resume), a
task whose state changed (an agent says it started or ended), a node registered or whose
state changed. Each such write notifies the channel `berth_wake`; PostgreSQL delivers the
notification when the transaction commits (none for one that rolls back) and folds the
repeats of one transaction into one, so a bulk insert of 10,000 array elements is one
wake-up. Row triggers are filtered by their WHEN clause, so an update that moves no state
(a lease renewal, a usage sample) costs no function call, and so do the scheduler loop's own
writes: its session sets `berth.quiet` for the length of its turn (sql.quiet_session), and
its next cycle comes at its interval as before. Unlike the change marks (0014),
which say whether a cycle may be skipped, these only say when to look.
"""

from typing import Any

from django.db import migrations

CHANNEL = "berth_wake"
# The loop's own writes are not news: its session says so (sql.quiet_session).
NOT_QUIET = "current_setting('berth.quiet', true) IS DISTINCT FROM 'on'"

CREATE = [
    f"""CREATE FUNCTION berth_wake_scheduler() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', '');
        RETURN NULL;
    END $$""",
    # Submissions: a job (an array's elements come in one statement), a flow.
    "CREATE TRIGGER berth_wake_insert AFTER INSERT ON scheduler_job"
    f" FOR EACH STATEMENT WHEN ({NOT_QUIET}) EXECUTE FUNCTION berth_wake_scheduler()",
    "CREATE TRIGGER berth_wake_insert AFTER INSERT ON scheduler_flow"
    f" FOR EACH STATEMENT WHEN ({NOT_QUIET}) EXECUTE FUNCTION berth_wake_scheduler()",
    # A user's request, to be carried out by the next cycle.
    "CREATE TRIGGER berth_wake_request AFTER UPDATE OF requested_action ON scheduler_job"
    " FOR EACH ROW WHEN (NEW.requested_action <> ''"
    f" AND OLD.requested_action IS DISTINCT FROM NEW.requested_action AND {NOT_QUIET})"
    " EXECUTE FUNCTION berth_wake_scheduler()",
    # A task that started or ended: its job's state follows in the next cycle.
    "CREATE TRIGGER berth_wake_task AFTER UPDATE OF state ON scheduler_task"
    f" FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND {NOT_QUIET})"
    " EXECUTE FUNCTION berth_wake_scheduler()",
    # A node that came, or became ready or not.
    "CREATE TRIGGER berth_wake_insert AFTER INSERT ON scheduler_node"
    f" FOR EACH STATEMENT WHEN ({NOT_QUIET}) EXECUTE FUNCTION berth_wake_scheduler()",
    "CREATE TRIGGER berth_wake_state AFTER UPDATE OF state ON scheduler_node"
    f" FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND {NOT_QUIET})"
    " EXECUTE FUNCTION berth_wake_scheduler()",
]
DROP = [
    "DROP TRIGGER IF EXISTS berth_wake_insert ON scheduler_job",
    "DROP TRIGGER IF EXISTS berth_wake_insert ON scheduler_flow",
    "DROP TRIGGER IF EXISTS berth_wake_request ON scheduler_job",
    "DROP TRIGGER IF EXISTS berth_wake_task ON scheduler_task",
    "DROP TRIGGER IF EXISTS berth_wake_insert ON scheduler_node",
    "DROP TRIGGER IF EXISTS berth_wake_state ON scheduler_node",
    "DROP FUNCTION IF EXISTS berth_wake_scheduler()",
]


def create_wakeups(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in CREATE:
            schema_editor.execute(statement)


def drop_wakeups(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0024_mig_instances")]

    operations = [migrations.RunPython(create_wakeups, drop_wakeups)]
