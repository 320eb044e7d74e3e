"""Event kinds and reasons are codes from scheduler/states/codes.py, never spelled again as
string literals by the code that writes them (issue #25)."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.states.codes import EventKind, Reason, member_name

ROOT = Path(__file__).resolve().parents[2]
WRITERS = re.compile(
    r"""record\(\s*f?["']|\bkind=f?["'][A-Z]|\breason=f?["'][A-Z]|\.reason = f?["'][A-Z]"""
)


def test_no_writer_spells_an_event_kind_or_a_reason_as_a_literal() -> None:
    spelled = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "scheduler").rglob("*.py"))
        if not path.is_relative_to(ROOT / "scheduler" / "migrations")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if WRITERS.search(line)
    ]
    assert spelled == []


def test_codes_are_named_after_their_values() -> None:
    for member in [*EventKind, *Reason]:
        assert member.name == member_name(member.value)
    assert EventKind.task_ended("Lost") is EventKind.TASK_LOST
