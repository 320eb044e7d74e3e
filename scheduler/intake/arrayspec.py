"""Job array index expressions, Slurm's `--array` syntax: pure functions, no Django.

Accepted (documented in docs/arrays.md):
    "0-999"        indices 0 to 999
    "0-99:2"       0, 2, 4 ... 98 (a step after a range)
    "1,3,5-9"      a comma-separated list of numbers and ranges
    "0-999%10"     any of the above, at most 10 elements active at once

Indices are whole numbers from 0 to MAX_INDEX; repeats are refused, so every element's index
is unique. The size bound is the caller's (a setting), checked here before any list is built,
so "0-999999999" costs nothing to refuse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_INDEX = 4_000_000
MAX_TEXT = 1000
_PART = re.compile(r"^(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?$")


class ArraySpecError(ValueError):
    """The expression is malformed; the message says why, for a person."""


@dataclass(frozen=True)
class ArraySpec:
    text: str  # as written, without spaces: "0-99:2%10"
    indices: tuple[int, ...]  # in the order written
    limit: int | None


def _ranges(text: str, max_elements: int) -> list[tuple[int, int, int]]:
    parts: list[tuple[int, int, int]] = []
    total = 0
    for part in text.split(","):
        match = _PART.match(part.strip())
        if not match:
            raise ArraySpecError(
                f"{part.strip()!r} is not a number, a range like 0-9, or a stepped range like 0-9:2"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if end < start:
            raise ArraySpecError(f"range {start}-{end} ends before it starts")
        if step < 1:
            raise ArraySpecError(f"step in {part.strip()!r} must be at least 1")
        if end > MAX_INDEX:
            raise ArraySpecError(f"indices must be at most {MAX_INDEX}, got {end}")
        total += (end - start) // step + 1
        if total > max_elements:
            raise ArraySpecError(f"at most {max_elements} elements per array, got more")
        parts.append((start, end, step))
    return parts


def parse_array(value: object, max_elements: int) -> ArraySpec:
    """`value` ("0-999%10") as an ArraySpec, or ArraySpecError saying what is wrong."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)  # `array: 7` in YAML: one element
    if isinstance(value, bool) or not isinstance(value, str):
        raise ArraySpecError(f'must be a string like "0-999" or "0-999%10", got {value!r}')
    text = value.strip()
    if not text:
        raise ArraySpecError('must not be empty: e.g. "0-999" or "1,3,5-9%2"')
    if len(text) > MAX_TEXT:
        raise ArraySpecError(f"must be at most {MAX_TEXT} characters")
    limit: int | None = None
    if "%" in text:
        text, _, raw_limit = text.partition("%")
        if not raw_limit.strip().isdigit() or len(raw_limit.strip()) > 9:
            raise ArraySpecError(f"the limit after % must be a whole number, got {raw_limit!r}")
        limit = int(raw_limit)
        if limit < 1:
            raise ArraySpecError("the limit after % must be at least 1")
    indices: list[int] = []
    for start, end, step in _ranges(text, max_elements):
        indices.extend(range(start, end + 1, step))
    if len(set(indices)) != len(indices):
        seen: set[int] = set()
        for index in indices:
            if index in seen:
                raise ArraySpecError(f"index {index} is listed more than once")
            seen.add(index)
    canonical = "".join(value.split())
    return ArraySpec(text=canonical, indices=tuple(indices), limit=limit)


def format_indices(indices: Iterable[int]) -> str:
    """Sorted indices as compact ranges: [0,1,2,5,7,8] -> "0-2,5,7-8"."""
    values = sorted(indices)
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)
