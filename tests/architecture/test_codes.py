"""Event kinds and reasons are codes from scheduler/states/codes.py, never spelled again as
string literals by the code that writes them (issue #25)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scheduler.states.codes import EventKind, Reason, member_name
from scheduler.states.names import FlowState, JobState, NodeState, StepState, TaskState

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


def test_no_code_is_spelled_as_a_string_anywhere_above_the_core() -> None:
    """Not only where a writer is called: no string in the server's code equals an event
    kind or a reason (one that is not also a state's name), wherever it is passed. The core
    and the node agent are below the codes' layer and speak their own wire words."""
    states = {s.value for e in (JobState, TaskState, FlowState, StepState, NodeState) for s in e}
    codes = {k.value for k in EventKind} | ({r.value for r in Reason} - states)
    below = ("scheduler/core/", "scheduler/agent/", "scheduler/migrations/")
    spelled = [
        f"{rel}:{node.lineno}: {node.value!r}"
        for folder in ("scheduler", "berth", "dashboard")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not (rel := path.relative_to(ROOT).as_posix()).startswith(below)
        and rel != "scheduler/states/codes.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in codes
    ]
    assert spelled == []


def test_codes_are_named_after_their_values() -> None:
    for member in [*EventKind, *Reason]:
        assert member.name == member_name(member.value)
    assert EventKind.task_ended("Lost") is EventKind.TASK_LOST
