"""Settings helpers reject bad values loudly, naming the variable."""

from __future__ import annotations

import pytest

from berth.env import ImproperlyConfiguredEnv, env_bool, env_float, env_int, env_list, env_url


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("yes", True), ("off", False), ("", False)]
)
def test_it_reads_booleans(raw, value):
    assert env_bool("X", default=not value, environ={"X": raw}) is value


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: env_bool("BERTH_DEBUG", False, environ={"BERTH_DEBUG": "maybe"}), "BERTH_DEBUG"),
        (lambda: env_int("N", 1, environ={"N": "1.5"}), "whole number"),
        (lambda: env_int("N", 1, minimum=1, environ={"N": "0"}), "at least 1"),
        (lambda: env_float("F", 1.0, environ={"F": "fast"}), "expected a number"),
        (lambda: env_float("F", 1.0, minimum=0, environ={"F": "-1"}), "at least 0"),
        (lambda: env_list("L", [], environ={"L": "a,,b"}), "no empty items"),
        (
            lambda: env_url("DATABASE_URL", ("postgres",), environ={"DATABASE_URL": "mysql://x"}),
            "postgres://",
        ),
    ],
)
def test_it_rejects_bad_values(call, words):
    with pytest.raises(ImproperlyConfiguredEnv, match=words):
        call()


def test_it_uses_defaults_when_unset():
    assert env_int("N", 7, environ={}) == 7
    assert env_url("REDIS_URL", ("redis",), environ={}) is None
    assert env_list("L", ["a"], environ={}) == ["a"]


def test_settings_refuse_to_start_without_a_secret_key_when_not_debugging(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "BERTH_DEBUG": "false", "BERTH_DATA_DIR": str(tmp_path)}
    env.pop("BERTH_SECRET_KEY", None)
    result = subprocess.run(
        [sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='berth.settings'; django.setup()"],  # noqa: E501
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0
    assert "BERTH_SECRET_KEY is required" in result.stderr
