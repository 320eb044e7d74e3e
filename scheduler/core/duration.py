"""Durations as users write them, one parser for the API's specs and the CLI's `--time`:

- whole seconds: `90` or `"90"` (as in the job spec; Slurm's bare number means minutes);
- units: `"90s"`, `"45m"`, `"1h30m"`, `"2d"`, `"1d 12h"` (d, h, m, s; in any order once each);
- a clock: `"30:00"` (MM:SS), `"01:30:00"` (HH:MM:SS);
- Slurm's days: `"1-00:00:00"` (D-HH:MM:SS), `"1-12:30"` (D-HH:MM), `"2-3"` (D-HH).

Pure (no Django): `parse_duration` returns whole seconds or raises ValueError saying which
forms are accepted.
"""

from __future__ import annotations

import re

FORMS = '90, "90s", "1h30m", "01:30:00" or "1-00:00:00"'
MAX_TEXT = 32  # characters: longer is never a duration, and is refused before any parsing
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNITS_RE = re.compile(r"^(?:\d{1,12}[dhms])+$")
_UNIT_RE = re.compile(r"(\d+)([dhms])")
_CLOCK_RE = re.compile(r"^(?:(\d{1,9})-)?(\d{1,12})(?::(\d{1,2}))?(?::(\d{1,2}))?$")


class DurationError(ValueError):
    """What is wrong with a duration, with the accepted forms."""


def _refuse(value: object) -> DurationError:
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
    return DurationError(f"must be a whole number of seconds or a duration: {FORMS}; got {shown}")


def parse_duration(value: object) -> int:
    """Whole seconds from an int or a string in one of the forms above."""
    if isinstance(value, bool):
        raise _refuse(value)
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _refuse(value)
    text = value.strip().lower()
    if text.isascii() and text.isdigit():
        return int(text)
    compact = text.replace(" ", "")
    if _UNITS_RE.match(compact):
        found = _UNIT_RE.findall(compact)
        units = [unit for _, unit in found]
        if len(set(units)) != len(units):
            raise _refuse(value)
        return sum(int(n) * _UNITS[u] for n, u in found)
    return _clock(text, value)


def _clock(text: str, value: object) -> int:
    """D-HH[:MM[:SS]], HH:MM:SS or MM:SS; minutes and seconds after a colon below 60."""
    match = _CLOCK_RE.match(text)
    if match is None:
        raise _refuse(value)
    days, first, second, third = match.groups()
    if days is None and second is None:
        raise _refuse(value)  # a bare number is handled above; this is "1:" and the like
    if days is not None:  # Slurm: days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # HH:MM:SS
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # MM:SS
        hours, minutes, seconds = 0, int(first), int(second)
    if (second is not None and int(second) >= 60) or (third is not None and seconds >= 60):
        raise _refuse(value)
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
