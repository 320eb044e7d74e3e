"""A flow's steps laid out as a left-to-right DAG, drawn as SVG on the server.

1. Each step's column is its depth (longest chain of dependencies before it).
2. Steps stack in their column in spec order; columns are centred on the tallest one.
3. Edges are cubic curves from a dependency's right edge to the dependant's left edge.
4. A fan-out step (one job per item) is drawn as a stack of cards with its count, and a strip
   of one segment per item coloured by that item's job state (grey: not created yet).
5. Nodes are links: a one-job step's card opens its job, each segment of a strip its item's
   job. A waiting step's tooltip says why it waits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT, GAP_X, GAP_Y, PAD = 184, 56, 56, 22, 14
STRIP_H = 6
DONE_STATES = ("Succeeded",)


@dataclass
class Segment:
    x: float
    width: float
    state: str  # job state, or "" for an item whose job does not exist yet
    job_id: int | None
    title: str


@dataclass
class Box:
    name: str
    state: str
    x: int
    y: int
    total: int  # jobs this step makes: 1, or one per item
    fan_out: bool
    label: str  # "2 running · 1 done" for a fan-out group, "" otherwise
    job_id: int | None = None  # a one-job step's (latest) job: the card links to it
    waiting: str = ""  # why the step waits, or ""
    segments: list[Segment] = field(default_factory=list)


def _depths(steps: list[Any]) -> dict[str, int]:
    depth: dict[str, int] = {}
    by_name = {s.name: s for s in steps}

    def level(name: str, seen: frozenset[str]) -> int:
        if name not in depth:
            deps = [d for d in by_name[name].depends_on if d in by_name and d not in seen]
            depth[name] = 1 + max((level(d, seen | {name}) for d in deps), default=-1)
        return depth[name]

    for step in steps:
        level(step.name, frozenset())
    return depth


def _summary(states: Counter[str], total: int) -> str:
    """`1/3 done · 2 running`: short enough for the box; the strip shows the rest."""
    parts = [f"{states.get('Succeeded', 0)}/{total} done"]
    for state in ("Running", "Failed", "Suspended"):
        if states.get(state):
            parts.append(f"{states[state]} {state.lower()}")
    return " · ".join(parts[:3])


def _segments(jobs: list[Any], total: int) -> list[Segment]:
    """A fan-out step's strip: one segment per item, coloured by its job's state."""
    by_item = {j.item_index: j for j in jobs}
    width = (WIDTH - 20) / total
    segments = []
    for i in range(total):
        job = by_item.get(i)
        state = job.state if job else ""
        title = f"item {i}: " + (f"job {job.pk} {state}" if job else "not started")
        segments.append(Segment(round(10 + i * width, 2), round(width, 2),
                                state, job.pk if job else None, title))  # fmt: skip
    return segments


def _edges(steps: list[Any], boxes: dict[str, Box]) -> list[dict[str, Any]]:
    """A curve from each dependency's right edge to its dependant's left edge."""
    edges = []
    for step in steps:
        for dep in step.depends_on:
            if dep in boxes:
                a, b = boxes[dep], boxes[step.name]
                x1, y1 = a.x + WIDTH + (6 if a.fan_out else 0), a.y + HEIGHT // 2
                x2, y2 = b.x - 2, b.y + HEIGHT // 2
                mid = (x1 + x2) // 2
                done = a.state in DONE_STATES
                edges.append({"d": f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}", "done": done})
    return edges


def layout(
    steps: list[Any], jobs_by_step: dict[int, list[Any]], waiting: dict[str, str] | None = None
) -> dict[str, Any]:
    """Boxes and edges for `steps` (FlowStep rows); `jobs_by_step` maps step id -> its jobs
    (each with `pk`, `state`, `item_index`), oldest first; `waiting` step name -> why it
    waits."""
    waiting = waiting or {}
    depth = _depths(steps)
    columns: dict[int, list[Any]] = {}
    for step in steps:
        columns.setdefault(depth[step.name], []).append(step)
    tallest = max((len(c) for c in columns.values()), default=1)
    boxes: dict[str, Box] = {}
    for column, members in columns.items():
        offset = (tallest - len(members)) * (HEIGHT + GAP_Y) // 2
        for row, step in enumerate(members):
            jobs = jobs_by_step.get(step.pk, [])
            fan_out = bool(step.items)
            total = len(step.items) if fan_out else 1
            box = Box(
                name=step.name, state=step.state,
                x=PAD + column * (WIDTH + GAP_X), y=PAD + offset + row * (HEIGHT + GAP_Y),
                total=total, fan_out=fan_out,
                label=_summary(Counter(j.state for j in jobs), total) if fan_out else "",
                job_id=jobs[-1].pk if jobs and not fan_out else None,
                waiting=waiting.get(step.name, ""),
            )  # fmt: skip
            if fan_out:
                box.segments = _segments(jobs, total)
            boxes[step.name] = box
    edges = _edges(steps, boxes)
    width = PAD * 2 + (max(depth.values(), default=0) + 1) * (WIDTH + GAP_X) - GAP_X + 6
    height = PAD * 2 + tallest * (HEIGHT + GAP_Y) - GAP_Y + 6
    return {"boxes": list(boxes.values()), "edges": edges, "width": width, "height": height,
            "box_w": WIDTH, "box_h": HEIGHT, "strip_y": HEIGHT - STRIP_H - 6,
            "strip_h": STRIP_H}  # fmt: skip
