"""The layers point one way: the scheduler never imports the dashboard (issue #14); the
dashboard hears about changes through scheduler.notify's registry."""

from __future__ import annotations

import ast
from pathlib import Path

from dashboard import live
from scheduler import notify

ROOT = Path(__file__).resolve().parents[2]


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


# The layers docs/architecture.md draws, highest first: a folder (or one of the Django app's
# own modules at a package's root) belongs to one layer. A module belongs to the layer of the
# longest entry its dotted name starts with; each may import its own layer and those below,
# never one above (imports inside functions and under TYPE_CHECKING count too).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", ("berth.settings", "berth.urls", "berth.asgi", "berth.cli",
                      "scheduler.management")),
    ("pages", ("dashboard",)),
    ("doors", ("berth.web", "scheduler.api", "scheduler.agentapi", "scheduler.admin",
               "scheduler.middleware")),
    ("services", ("scheduler.cycle", "scheduler.jobs", "scheduler.lifecycle", "scheduler.flows",
                  "scheduler.ops", "scheduler.notifications", "scheduler.notify",
                  "scheduler.sql")),
    ("models", ("scheduler.models", "scheduler.outbox", "scheduler.states", "scheduler.intake",
                "scheduler.apps", "scheduler.migrations")),
    ("no Django", ("scheduler.core", "scheduler.agent", "berth.env")),
]  # fmt: skip
# Packages whose __init__ is empty of imports: below everything, whatever they hold.
EMPTY_PACKAGES = {
    "scheduler",
    "scheduler.agent",
    "scheduler.agentapi",
    "scheduler.management",
    "berth",
}
PACKAGES = ("scheduler", "dashboard", "berth")


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def layer_of(module: str) -> int:
    """The layer's index in LAYERS (0 is the highest)."""
    if module in EMPTY_PACKAGES:
        return len(LAYERS) - 1
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if matches:
        return max(matches)[1]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and the drawing")


def project_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports: `from a.b import c` names a.b.c when that is a
    module, else a.b; relative imports are resolved against the file's package."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            candidates = [[f"{base}.{alias.name}", base] for alias in node.names]
        else:
            continue
        for names in candidates:
            target = next((n for n in names if n in modules), None)
            if target is None and names[-1].split(".")[0] in PACKAGES:
                target = names[-1]  # a name inside a module: the module is its last part
                while target and target not in modules:
                    target = target.rpartition(".")[0]
            if target and target != here:
                found.add(target)
    return found


def all_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_every_import_points_down_the_layers_drawn_in_the_architecture() -> None:
    modules = all_modules()
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, path in modules.items()
        for target in project_imports(path, set(modules))
        if layer_of(target) < layer_of(module)
    )
    assert upward == []


def test_the_no_django_layer_imports_no_django() -> None:
    """The core, the node agent and their helpers run where Django is not installed."""
    modules = all_modules()
    bottom = len(LAYERS) - 1
    django = sorted(
        module
        for module, path in modules.items()
        if layer_of(module) == bottom
        and {"django", "rest_framework", "channels"} & {n.split(".")[0] for n in _imports(path)}
    )  # fmt: skip
    assert django == []


def test_every_module_is_in_a_layer_and_the_empty_packages_import_nothing() -> None:
    modules = all_modules()
    for module in modules:
        layer_of(module)  # raises for a module the drawing does not place
    for package in EMPTY_PACKAGES:
        assert project_imports(modules[package], set(modules)) == set(), package


# What the node agent (scheduler/agent/, installed on every node) may import from the project
# besides itself: the quantity grammar its flags share with specs (pure Python, no state).
NODE_PACKAGE = "scheduler.agent"
NODE_MAY_IMPORT = {"scheduler.core.quantity"}


def test_the_node_package_imports_nothing_of_the_server() -> None:
    """The node is a package of its own: the server imports it (the wire format, the
    simulator), it imports nothing of the server, so no folder ties the two both ways."""
    modules = all_modules()
    outside = sorted(
        f"{module} imports {target}"
        for module, path in modules.items()
        if module == NODE_PACKAGE or module.startswith(NODE_PACKAGE + ".")
        for target in project_imports(path, set(modules))
        if not (target == NODE_PACKAGE or target.startswith(NODE_PACKAGE + "."))
        and target not in NODE_MAY_IMPORT
    )
    assert outside == []
