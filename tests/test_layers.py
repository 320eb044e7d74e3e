"""The layers point one way: the scheduler never imports the dashboard (issue #14); the
dashboard hears about changes through scheduler.notify's registry."""

from __future__ import annotations

import ast
from pathlib import Path

from dashboard import live
from scheduler import notify

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_scheduler_never_imports_the_dashboard() -> None:
    upward = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if n.startswith("dashboard"))
        for path in sorted((ROOT / "scheduler").rglob("*.py"))
    }
    assert {path: names for path, names in upward.items() if names} == {}


def test_the_dashboard_app_connects_its_renderers_when_it_is_ready() -> None:
    assert live.publish in notify._change_listeners
    assert live.publish_log in notify._log_listeners
