"""Reading a task's stored output: the one place the REST API (`berth logs`, the log
download, the JSON `logs/` endpoint) and the dashboard (the job page's tail, a flow's
latest lines) read `TaskLog` rows. Agents write them (scheduler/agent/protocol.py).

Output is stored as chunks keyed by (task, attempt, offset). An agent may re-send output
from an earlier offset after a lost answer, so chunks can overlap: every reader here keeps
only the bytes past what it has already produced. Reads go a few chunks at a time, so a
reader costs bounded memory however long the log is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import F

from scheduler.models import Flow, Task, TaskLog

CHUNKS_PER_READ = 16  # agents' chunks are at most BERTH_LOG_CHUNK_BYTES (64 KiB) each
TAIL_CHARS = 20000  # what the pages show of a log's end


def parse_attempt(raw: str, latest: int) -> int | None:
    """`raw` as one of a task's attempts (0 to its `latest`), or None."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or int(raw) > latest:
        return None
    return int(raw)


def read_chunks(task_id: int, attempt: int, after: int) -> list[tuple[int, str]]:
    """The next chunks (offset, text) of an attempt's output, with offsets above `after`."""
    rows = TaskLog.objects.filter(task_id=task_id, attempt=attempt, offset__gt=after)
    return list(rows.order_by("offset").values_list("offset", "data")[:CHUNKS_PER_READ])


class LogStream:
    """An attempt's bytes in offset order; a chunk that overlaps what was sent (an agent
    re-sent output from an earlier offset) contributes only its new tail."""

    def __init__(self, task_id: int, attempt: int) -> None:
        self.task_id, self.attempt = task_id, attempt
        self.after = -1  # offsets read so far
        self.end = 0  # bytes sent so far

    def pieces(self, chunks: list[tuple[int, str]]) -> list[bytes]:
        out = []
        for offset, text in chunks:
            self.after = offset
            data = text.encode()
            stop = offset + len(data)
            if stop > self.end:
                out.append(data[max(0, self.end - offset) :])
                self.end = stop
        return out

    def __iter__(self) -> Iterator[bytes]:
        while chunks := read_chunks(self.task_id, self.attempt, self.after):
            yield from self.pieces(chunks)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = sync_to_async(read_chunks)
        while chunks := await read(self.task_id, self.attempt, self.after):
            for piece in self.pieces(chunks):
                yield piece


def text_after(
    tasks: Iterable[Task], after: int, attempt: int | None
) -> dict[int, tuple[str, int]]:
    """Each task's output from byte `after` on, of `attempt` (None: each task's latest), and
    the offset to ask for next time, in one query for all the tasks. A chunk that straddles
    `after` contributes only its tail."""
    tasks = list(tasks)
    chunks = TaskLog.objects.filter(task__in=tasks).order_by("task_id", "offset")
    if attempt is not None:
        chunks = chunks.filter(attempt=attempt)
    else:
        chunks = chunks.filter(attempt=F("task__attempt"))
    by_task: dict[int, list[TaskLog]] = {}
    # Agents send chunks of at most BERTH_LOG_CHUNK_BYTES, so one that straddles `after`
    # starts no earlier than this.
    for chunk in chunks.filter(offset__gte=after - settings.BERTH_LOG_CHUNK_BYTES):
        by_task.setdefault(chunk.task_id, []).append(chunk)
    return {task.pk: _join_after(by_task.get(task.pk, []), after) for task in tasks}


def _join_after(chunks: list[TaskLog], after: int) -> tuple[str, int]:
    parts: list[bytes] = []
    end = after
    for chunk in chunks:
        data = chunk.data.encode()
        stop = chunk.offset + len(data)
        if stop <= after:
            continue
        parts.append(data[max(0, after - chunk.offset) :])
        end = max(end, stop)
    return b"".join(parts).decode(errors="replace"), end


def tail(task_id: int, attempt: int, chars: int = TAIL_CHARS) -> tuple[str, bool]:
    """The last `chars` characters of an attempt's output, and whether earlier output was left
    out (read from the end, a few chunks at a time, however long the log is)."""
    parts: list[str] = []
    total = 0
    rows = TaskLog.objects.filter(task_id=task_id, attempt=attempt).order_by("-offset")
    for data in rows.values_list("data", flat=True).iterator(chunk_size=8):
        if total > chars:
            break
        parts.append(data)
        total += len(data)
    text = "".join(reversed(parts))
    return text[-chars:], total > chars


def flow_tail(flow: Flow, chunks: int = 40) -> str:
    """The flow's latest output across its jobs, each line prefixed by job/task (the same
    prefix the dashboard puts on lines pushed later)."""
    rows = list(
        TaskLog.objects.filter(task__job__flow=flow)
        .order_by("-id")
        .values_list("data", "task__job__name", "task__group", "task__index")[:chunks]
    )
    lines = []
    for data, job_name, group, index in reversed(rows):
        label = f"{job_name}/{group}-{index}"
        chunk = "".join(f"{label}  {line}" for line in data.splitlines(keepends=True))
        lines.append(chunk if chunk.endswith("\n") else chunk + "\n")
    return "".join(lines)[-TAIL_CHARS:]
