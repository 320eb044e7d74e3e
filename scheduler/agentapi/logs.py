"""`tasks/<id>/log/` and output sent inline in a report: an attempt's output kept in chunks
by byte offset, capped at BERTH_LOG_MAX_BYTES, pushed to live pages."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q

from scheduler import notify
from scheduler.agentapi.common import ProtocolError
from scheduler.intake.specs import UNSTORABLE
from scheduler.models import Node, Task, TaskLog

TRUNCATED = "\n[berth: output truncated: the rest of this attempt's output was dropped]\n"
INLINE_OUTPUT_BYTES = 16 * 1024  # output a report may carry inline (at most one log chunk)


def inline_output_bytes() -> int:
    """How much output a report may carry inline: the rest goes to `tasks/<id>/log/`."""
    return min(INLINE_OUTPUT_BYTES, settings.BERTH_LOG_CHUNK_BYTES)


def append_log(node: Node, task_id: int, data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    attempt, offset, text = data.get("attempt"), data.get("offset"), data.get("data")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 <= attempt < 2**31:
        errors["attempt"] = ["must be a non-negative integer"]
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**62:
        errors["offset"] = ["must be a non-negative integer"]
    if not isinstance(text, str):
        errors["data"] = ["must be a string"]
    else:
        text = storable_text(text)
        if len(text.encode()) > settings.BERTH_LOG_CHUNK_BYTES:
            errors["data"] = [f"chunk larger than {settings.BERTH_LOG_CHUNK_BYTES} bytes"]
    if errors:
        raise ProtocolError(errors)
    assert isinstance(attempt, int) and isinstance(offset, int) and isinstance(text, str)
    task = Task.objects.filter(pk=task_id, node=node).first()
    if task is None:
        raise ProtocolError({"task": [f"task {task_id} is not on node {node.name}"]}, status=404)
    with transaction.atomic():
        kept = store_chunk(task, attempt, offset, text)
    answer: dict[str, Any] = {"next_offset": offset + len(text.encode())}
    if kept >= settings.BERTH_LOG_MAX_BYTES:
        answer["dropped"] = True
    return answer


def store_chunk(
    task: Task, attempt: int, offset: int, text: str, contiguous: bool = False,
    kept: int | None = None, pending: list[TaskLog] | None = None,
) -> int:  # fmt: skip
    """Keep one chunk of an attempt's output at byte `offset` (a chunk held already, sent
    again, is ignored; past BERTH_LOG_MAX_BYTES the rest is dropped, said once; with
    `contiguous`, a chunk that would leave a gap is not kept). Returns the bytes held now:
    BERTH_LOG_MAX_BYTES once the cap is hit. Inside a transaction. `kept`: the bytes held,
    when read already; `pending`: where to put the chunk for the caller to insert."""
    size = len(text.encode())
    if kept is None:
        kept = kept_bytes(task, attempt)
    if kept >= settings.BERTH_LOG_MAX_BYTES or offset + size <= kept:
        return kept  # over the cap, or held already (a retried upload)
    if contiguous and offset > kept:
        return kept  # the agent sends the output from what the server says it has
    capped = kept + size > settings.BERTH_LOG_MAX_BYTES
    if capped:  # keep what fits, then say once that the rest is gone
        room = max(settings.BERTH_LOG_MAX_BYTES - kept, 0)
        text = text.encode()[:room].decode(errors="ignore") + TRUNCATED
    chunk = TaskLog(task=task, attempt=attempt, offset=offset, data=text)
    if pending is not None:
        pending.append(chunk)
    else:  # ON CONFLICT DO NOTHING: the same chunk from a concurrent retry, no savepoint
        TaskLog.objects.bulk_create([chunk], ignore_conflicts=True)
    notify.changed(jobs=[task.job_id])
    _published_log(task, attempt, offset, text)
    return settings.BERTH_LOG_MAX_BYTES if capped else max(kept, offset + size)


def storable_text(text: str) -> str:
    """Task output as the database can hold it: NUL (PostgreSQL refuses it in text) and lone
    surrogates (not UTF-8) become U+FFFD, as the agent already does for undecodable bytes."""
    return UNSTORABLE.sub("\ufffd", text)


def kept_many(attempts: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """`kept_bytes` of several (task id, attempt) at once: the last chunk of each, in two
    queries (one when none has output yet)."""
    wanted = set(attempts)
    held = dict.fromkeys(wanted, 0)
    if not wanted:
        return held
    last = (
        TaskLog.objects.filter(task_id__in={t for t, _ in wanted})
        .order_by()
        .values_list("task_id", "attempt")
        .annotate(last=Max("offset"))
    )
    where = [Q(task_id=t, attempt=a, offset=o) for t, a, o in last if (t, a) in wanted]
    if not where:
        return held
    rows = TaskLog.objects.filter(reduce(operator.or_, where))
    for task_id, attempt, offset, data in rows.values_list("task_id", "attempt", "offset", "data"):
        held[(task_id, attempt)] = _held_after(offset, data)
    return held


def kept_bytes(task: Task, attempt: int) -> int:
    last = TaskLog.objects.filter(task=task, attempt=attempt).order_by("-offset").first()
    return 0 if last is None else _held_after(last.offset, last.data)


def _held_after(offset: int, data: str) -> int:
    """The bytes of an attempt's output held, given its last chunk: BERTH_LOG_MAX_BYTES once
    the cap cut it (the chunk ends with TRUNCATED)."""
    if data.endswith(TRUNCATED):
        return settings.BERTH_LOG_MAX_BYTES
    return offset + len(data.encode())


def _published_log(task: Task, attempt: int, offset: int, text: str) -> None:
    notify.log_appended(task.pk, attempt, offset, text)  # after commit, to the listeners
