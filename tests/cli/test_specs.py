"""The CLI's spec building: durations, #BERTH directives, options -> job spec (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from berth.cli.client import CliError, flatten_errors
from berth.cli.specs import directives, is_script, job_from_options, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("1h30m", 5400), ("45m", 2700), ("2d", 172800), ("1h 5s", 3605),
     ("01:30:00", 5400), ("30:00", 1800), ("1-12:00:00", 129600), ("2-3", 183600),
     ("1-12:30", 131400)],  # D-HH:MM as Slurm reads it (was taken for D-MM:SS)
)  # fmt: skip
def test_it_reads_durations_as_users_write_them(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1:2:3:4", "1x", "a-01:00:00", "01:60:00", "1h1h"])
def test_it_refuses_durations_it_cannot_read(text: str) -> None:
    with pytest.raises(CliError, match="--time"):
        parse_duration(text)


def test_it_reads_directives_only_before_the_first_command() -> None:
    script = (
        "#!/bin/bash\n#BERTH --gpus 2 --time 1h  # two GPUs\n\n#BERTH -J 'my job'\n"
        "# a comment\necho hi\n#BERTH --queue late\n"
    )
    assert directives(script) == ["--gpus", "2", "--time", "1h", "-J", "my job"]
    assert is_script(script) and not is_script("name: x\ntasks: []\n")


def test_it_builds_a_one_task_job_from_options() -> None:
    spec = job_from_options(
        "python Train.py --lr 0.1",
        {"gpus": 1, "cpu": "4", "mem": "16Gi", "time": "1h30m", "array": "0-9%2", "queue": "q"},
    )
    assert spec == {
        "name": "python",
        "queue": "q",
        "walltime": 5400,
        "array": "0-9%2",
        "tasks": [{"name": "main", "command": "python Train.py --lr 0.1",
                   "resources": {"cpu": "4", "memory": "16Gi", "gpu": 1}}],
    }  # fmt: skip
    assert job_from_options("./Run_Me.sh", {})["name"] == "run_me.sh"


def test_it_flattens_the_servers_field_errors() -> None:
    body = {"tasks": [{"resources": {"gpu": ["must be a whole number"]}}], "detail": "nope"}
    assert flatten_errors(body) == ["tasks.0.resources.gpu: must be a whole number", "nope"]


def test_config_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.cli.client import Settings, load_settings, save_settings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("BERTH_URL", raising=False)
    monkeypatch.delenv("BERTH_TOKEN", raising=False)
    monkeypatch.setattr("os.umask", lambda *_: 0)
    path = save_settings(Settings("http://x", "secret", "alice"))
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert load_settings() == Settings("http://x", "secret", "alice")
