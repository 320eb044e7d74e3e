"""Draw bench/e2e.py's timeline (queue depth and throughput over time) as a standalone SVG.

    python bench/e2e.py ... > e2e.json
    python bench/plot_timeline.py e2e.json docs/e2e-timeline.svg

No plotting library: a few polylines on a grid are all the chart needs, and the SVG is small
enough to keep in docs/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, PAD = 760, 320, 48
SERIES = (("pending", "#d97706"), ("running", "#2563eb"), ("finished_per_s", "#16a34a"))


def _polyline(points: list[tuple[float, float]], colour: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>'


def render(samples: list[dict[str, Any]], title: str) -> str:
    """`samples`: [{"t": s, "pending": n, "running": n, "finished": n}, ...] in time order."""
    rows = []
    for prev, cur in zip([None, *samples], samples, strict=False):
        rate = 0.0
        if prev is not None and cur["t"] > prev["t"]:
            rate = (cur["finished"] - prev["finished"]) / (cur["t"] - prev["t"])
        rows.append({**cur, "finished_per_s": rate})
    t_max = max((r["t"] for r in rows), default=1.0) or 1.0
    y_max = max((max(r[k] for k, _ in SERIES) for r in rows), default=1.0) or 1.0
    plot_w, plot_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD

    def at(t: float, v: float) -> tuple[float, float]:
        return PAD + plot_w * t / t_max, HEIGHT - PAD - plot_h * v / y_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{PAD}" y="20" font-size="14">{title}</text>',
    ]
    for i in range(5):
        v = y_max * i / 4
        _, y = at(0, v)
        parts.append(f'<line x1="{PAD}" x2="{WIDTH - PAD}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#e5e7eb"/><text x="4" y="{y + 4:.1f}">{v:.0f}</text>')  # fmt: skip
    for i in range(6):
        t = t_max * i / 5
        x, _ = at(t, 0)
        parts.append(f'<text x="{x - 8:.1f}" y="{HEIGHT - PAD + 16}">{t:.0f}s</text>')
    for key, colour in SERIES:
        parts.append(_polyline([at(r["t"], r[key]) for r in rows], colour))
    for i, (key, colour) in enumerate(SERIES):
        x = PAD + 10 + i * 170
        label = key.replace("_", " ")
        parts.append(f'<rect x="{x}" y="{HEIGHT - 18}" width="12" height="4" fill="{colour}"/>'
                     f'<text x="{x + 16}" y="{HEIGHT - 12}">{label}</text>')  # fmt: skip
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="the JSON bench/e2e.py printed")
    parser.add_argument("svg", type=Path, help="where to write the chart")
    args = parser.parse_args()
    data = json.loads(args.result.read_text())
    berth = data.get("berth", data)
    title = (f"Berth: {berth.get('jobs')} jobs, {berth.get('clients')} clients, "
             f"{berth.get('nodes')} nodes x {berth.get('gpus_per_node')} GPUs")  # fmt: skip
    args.svg.write_text(render(berth["queue_depth"], title))


if __name__ == "__main__":
    main()
