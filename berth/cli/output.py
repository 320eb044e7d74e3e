"""Plain, aligned tables like `squeue` prints (easy to read, easy to `grep`), and JSON for
scripts."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import click

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], empty: str) -> None:
    if not rows:
        click.echo(empty)
        return
    cells = [[_text(get(row)) for _, get in columns] for row in rows]
    heads = [name for name, _ in columns]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    for line in [heads, *cells]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def _text(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def job_reason(job: dict[str, Any]) -> str:
    """What a user most wants to know about a job in one cell: the status code it waits with
    (NeverFits marked, since waiting cannot help), else how it ended. The START column holds
    the estimate; `berth show` prints the status message."""
    status = job.get("status")
    if status:
        code = str(status.get("code") or "")
        return f"{code}!" if code == "NeverFits" else code
    if job.get("state") in WAITING:
        # Waiting, but no scheduler cycle has looked at it yet (just submitted, requeued after
        # a node loss, resumed): say so rather than leave the cell blank or show how an
        # earlier attempt ended.
        return NOT_YET_CONSIDERED
    return job.get("message") or job.get("reason") or ""


WAITING = ("Pending", "Suspended")
NOT_YET_CONSIDERED = "AwaitingCycle"

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", re.ASCII)
_FACTORS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}  # fmt: skip


def memory_text(value: Any) -> str | None:
    """A memory size for people: bytes (an int) or a quantity as the API writes it
    (`"24684096Ki"`) -> `"23.5Gi"`: the largest binary unit it holds at least once, one
    decimal unless whole. Anything unreadable is shown as it came; None stays None."""
    if value is None or isinstance(value, bool):
        return None
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        return str(value)
    size = float(match[1]) * _FACTORS[match[2]]
    for unit in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        if size >= _FACTORS[unit]:
            return f"{size / _FACTORS[unit]:.1f}".removesuffix(".0") + unit
    return f"{size:.0f}"


def job_position(job: dict[str, Any]) -> Any:
    """Its place in its queue (1 = next), like squeue's priority order; "-" when not waiting."""
    return job.get("queue_position")


def job_start(job: dict[str, Any]) -> str | None:
    """When a waiting job should start, in local time (like `squeue --start`); "unknown" when
    the server has no estimate, "-" for a job that does not wait."""
    if job.get("state") not in ("Pending", "Suspended"):
        return None
    value = job.get("estimated_start_at")
    if not value:
        return "unknown"
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone()
    except ValueError:
        return str(value)
    now = datetime.now().astimezone()
    return when.strftime("%H:%M:%S" if when.date() == now.date() else "%Y-%m-%d %H:%M")
