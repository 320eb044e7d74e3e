"""A task's start and end as its agent saw them (the process's own times), kept sane.

An agent reports `started_at` and `ended_at` (Unix seconds) with each task. The server stores
them instead of the time the report arrived, within bounds: a time more than CLOCK_SKEW in the
future, or before the task was assigned by more than CLOCK_SKEW, is absurd (a broken clock, a
hostile agent) and the server's own time is kept instead; a time within the skew is clamped to
[assigned, now], and an end never precedes its start.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

log = logging.getLogger("berth.agent")
CLOCK_SKEW = timedelta(seconds=60)  # how far an agent's clock may be off the server's
MAX_UNIX_TIME = 2**40  # far beyond any real time; bounds what a report may carry


def parse_unix_time(item: dict[str, object], key: str, path: str,
                    errors: dict[str, list[str]]) -> float | None:  # fmt: skip
    """The optional Unix time `item[key]`; a bad value is an error named `path.key`."""
    value = item.get(key)
    if value is None:
        return None
    number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
    if not math.isfinite(number) or not 0 < number < MAX_UNIX_TIME:
        errors[f"{path}.{key}"] = ["must be a Unix time in seconds, or null"]
        return None
    return number


def process_time(reported: float | None, now: datetime, not_before: datetime | None,
                 what: str) -> datetime:  # fmt: skip
    """The time to store for an event the agent says happened at `reported`: it, bounded to
    [not_before, now]; `now` when it is missing or absurd."""
    if reported is None:
        return now
    when = datetime.fromtimestamp(reported, UTC)
    if when > now + CLOCK_SKEW or (not_before is not None and when < not_before - CLOCK_SKEW):
        log.warning("ignoring the %s time %s an agent reported (server time %s)", what,
                    when.isoformat(), now.isoformat())  # fmt: skip
        return now
    when = min(when, now)
    return max(when, not_before) if not_before is not None else when
