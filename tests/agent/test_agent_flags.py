"""The agent's enforcement flags: --enforce, --pids-limit, --task-uids, --keep-work-dirs;
a bad value exits naming the flag."""

from __future__ import annotations

import os

import pytest

from scheduler.agent.command import UsageError, make_agent, parser


def options(tmp_path, *argv: str) -> dict[str, object]:
    return vars(parser().parse_args(["--server", "http://x", "--work-dir", str(tmp_path),
                                     *argv]))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--pids-limit", "0"], "--pids-limit"),
        (["--task-uids", "10-5"], "--task-uids"),
        (["--task-uids", "nonsense"], "--task-uids"),
        (["--keep-work-dirs", "-1"], "--keep-work-dirs"),
        (["--allow-device", "c 231 rw"], "--allow-device"),
        (["--allow-device", "x 1:3 rw"], "--allow-device"),
        (["--allow-device", "a"], "--allow-device"),  # every device
        (["--allow-device", "c *:* rw"], "--allow-device"),  # every character device
        ([arg for _ in range(65) for arg in ("--allow-device", "c 1:3 r")], "--allow-device"),
    ],
)
def test_a_bad_enforcement_flag_is_named(tmp_path, monkeypatch, argv, flag):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "x")
    with pytest.raises(UsageError, match=flag):
        make_agent(options(tmp_path, *argv))


def test_the_flags_reach_the_agent(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "x")
    agent = make_agent(options(tmp_path, "--enforce", "best-effort", "--pids-limit", "64",
                               "--task-uids", "off", "--keep-work-dirs", "60",
                               "--allow-device", "c 231:*  rw", "--allow-device", "c 10:229 rw",
                               "--name", "flags-node"))  # fmt: skip
    described = agent.fence.describe()
    assert (described["mode"], described["pids_limit"]) == ("best-effort", 64)
    assert described["allowed_devices"] == ["c 231:* rw", "c 10:229 rw"]
    assert agent.fence.limits({}, []).allow == ("c 231:* rw", "c 10:229 rw")
    assert agent.task_uids is None and agent.keep_work_dirs == 60
    agent.fence.close()


def test_enforcement_is_required_by_default_as_root_only(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTH_JOIN_TOKEN", "x")
    agent = make_agent(options(tmp_path, "--name", "default-node"))
    expected = "required" if os.geteuid() == 0 else "best-effort"
    assert agent.fence.describe()["mode"] == expected
    agent.fence.close()


def test_an_unknown_enforcement_mode_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--server", "http://x", "--enforce", "sometimes"])
    assert "--enforce" in capsys.readouterr().err
