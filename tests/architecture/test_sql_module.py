"""Hand-written SQL lives in one module, scheduler/sql.py (migrations aside); each of its
statements is tested against what the ORM writes in tests/app/test_sql.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_but_sql_opens_a_cursor():
    found = []
    for folder in ("scheduler", "berth", "dashboard"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "scheduler/sql.py" or rel.startswith("scheduler/migrations/"):
                continue
            text = path.read_text()
            if ".cursor(" in text or "cursor.execute" in text or ".raw(" in text:
                found.append(rel)
    assert found == []
