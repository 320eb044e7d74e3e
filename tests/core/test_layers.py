"""The core's modules import each other without a cycle and never import Django or the
rest of Berth: read from their source, counting imports under TYPE_CHECKING and inside
functions too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import scheduler.core

CORE = Path(scheduler.core.__file__).parent


def core_modules() -> list[str]:
    return sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")


def imported(module: str) -> set[str]:
    """Every module name the source of `scheduler.core.<module>` imports, anywhere in it."""
    tree = ast.parse((CORE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = "scheduler.core" + (f".{node.module}" if node.module else "")
                names.add(base)
                names.update(f"scheduler.core.{a.name}" for a in node.names if not node.module)
            elif node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def core_graph() -> dict[str, set[str]]:
    modules = set(core_modules())
    graph = {}
    for module in modules:
        graph[module] = {
            name.removeprefix("scheduler.core.").split(".")[0]
            for name in imported(module)
            if name.startswith("scheduler.core.")
        } & modules
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cores_imports_form_a_dag():
    graph = core_graph()
    assert {"session", "plugins", "types", "actions", "cycle"} <= set(graph)
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_core_imports_nothing_of_django_or_the_rest_of_berth():
    for module in core_modules():
        outside = {
            name
            for name in imported(module)
            if name.split(".")[0] in ("django", "rest_framework", "dashboard", "berth")
            or (name.startswith("scheduler.") and not name.startswith("scheduler.core"))
        }
        assert outside == set(), module


def test_every_core_module_imports_on_its_own():
    for module in core_modules():
        importlib.import_module(f"scheduler.core.{module}")
