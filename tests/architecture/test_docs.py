"""The docs stay true to the code where a test can tell: every file they name exists, the
architecture draws the layers tests/architecture/test_layers.py enforces, and docs/agents.md
names the protocol version the agent speaks."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.agent.client import PROTOCOL
from tests.architecture.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
# A path into the repository: `scheduler/lifecycle/`, `bench/replay.py`, docs/spec.md.
PATH = re.compile(r"(?<![\w/.-])((?:scheduler|dashboard|berth|bench|tests|static|templates|docs)"
                  r"/[\w./-]*[\w/])")  # fmt: skip
NOT_PATHS = {"berth/array", "docs/tests"}  # a label key; "Berth's docs/tests" in prose


def test_every_file_the_docs_name_exists():
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in PATH.findall(doc.read_text())
        if path not in NOT_PATHS and not (ROOT / path).exists()
    ]
    assert missing == []


def test_the_architecture_draws_the_layers_the_tests_enforce():
    text = (ROOT / "docs/architecture.md").read_text()
    drawing = text[text.index("## Layers") :].split("```")[1]
    drawn = [line[1:].split("  ")[0] for line in drawing.splitlines() if line[1:2].isalpha()]
    assert drawn == [name for name, _ in LAYERS]
    assert "▲" not in drawing and "↑" not in drawing  # no arrow points up


def test_the_agent_docs_name_the_protocol_the_agent_speaks():
    text = (ROOT / "docs/agents.md").read_text()
    versions = re.findall(r"protocol \(version (\d+)\)|Protocol: (\d+)`|version than (\d+)", text)
    named = {int(v) for found in versions for v in found if v}
    assert named == {PROTOCOL}, versions
