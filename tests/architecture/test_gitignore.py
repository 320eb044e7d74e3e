"""What Berth writes by default inside a checkout is ignored by git, so a `git add -A` after
trying it never commits a secret, a database or a task's files: the data dir (secret key,
passwords, SQLite), `up`'s task dirs beside it and the agent's default work dir."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from scheduler.agent.command import parser
from scheduler.management.commands.up import default_task_dir

ROOT = Path(__file__).resolve().parents[2]


def ignored(path: Path) -> bool:
    done = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
    if done.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    return done.returncode == 0


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_default_data_task_and_work_dirs_are_ignored_by_git():
    data = ROOT / "data"  # berth/settings.py's default DATA_DIR
    work = Path(parser().parse_args(["--server", "http://server"]).work_dir)
    assert not work.is_absolute()  # relative to where the agent starts: a checkout, often
    for path in (data, default_task_dir(data), ROOT / work):
        assert ignored(path / "any-file"), path
