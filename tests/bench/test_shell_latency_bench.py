"""bench/shell_latency.py at its smallest (issue #24): it starts the embedded server with its
local agent, times keystrokes through a session and `berth shell` to its prompt, and prints
JSON with both. Its figures are in docs/benchmarks.md; nothing here asserts a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_it_prints_the_round_trip_and_the_time_to_the_prompt() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BERTH_TEST_DB_NAME"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "shell_latency.py"), "--keys", "3", "--shells", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["bench"] == "shell_latency"
    keys = result["keystroke_round_trip"]
    assert keys["n"] == 3 and 0 < keys["p50_ms"] <= keys["p99_ms"] <= keys["max_ms"]
    (run,) = result["shell_to_prompt"]["runs"]
    assert 0 < run["submitted_s"] < run["prompt_s"]
    assert {"placed", "job_running", "session_open"} <= set(run["server_s"])
