"""A flow's steps laid out as a left-to-right DAG, drawn as SVG on the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WIDTH, HEIGHT, GAP_X, GAP_Y, PAD = 150, 46, 60, 22, 12


@dataclass
class Box:
    name: str
    state: str
    x: int
    y: int
    label: str  # e.g. "3/4 done" for a fan-out group


def layout(steps: list[Any], counts: dict[int, dict[str, int]]) -> dict[str, Any]:
    """Boxes and edges for `steps` (FlowStep rows); `counts` maps step id -> job states."""
    depth: dict[str, int] = {}
    by_name = {s.name: s for s in steps}

    def level(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in depth:
            deps = [d for d in by_name[name].depends_on if d in by_name and d not in seen]
            depth[name] = 1 + max((level(d, seen | {name}) for d in deps), default=-1)
        return depth[name]

    rows: dict[int, int] = {}
    boxes = {}
    for step in steps:
        column = level(step.name)
        row = rows.get(column, 0)
        rows[column] = row + 1
        states = counts.get(step.pk, {})
        total = len(step.items) if step.items else 1
        done = states.get("Succeeded", 0)
        label = f"{done}/{total} done" if step.items else ""
        boxes[step.name] = Box(
            step.name, step.state,
            PAD + column * (WIDTH + GAP_X), PAD + row * (HEIGHT + GAP_Y), label,
        )  # fmt: skip
    edges = []
    for step in steps:
        for dep in step.depends_on:
            if dep in boxes:
                a, b = boxes[dep], boxes[step.name]
                x1, y1 = a.x + WIDTH, a.y + HEIGHT // 2
                x2, y2 = b.x, b.y + HEIGHT // 2
                mid = (x1 + x2) // 2
                edges.append(f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}")
    width = PAD * 2 + (max(depth.values(), default=0) + 1) * (WIDTH + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values(), default=1) * (HEIGHT + GAP_Y) - GAP_Y
    return {"boxes": list(boxes.values()), "edges": edges, "width": width, "height": height,
            "box_w": WIDTH, "box_h": HEIGHT}  # fmt: skip
