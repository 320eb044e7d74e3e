"""Settings helpers reject bad values loudly, naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from berth.env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_url,
)

ROOT = Path(__file__).resolve().parents[2]


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
        (lambda: env_float("F", 1.0, minimum=0, environ={"F": "inf"}), "finite"),
        (lambda: env_float("F", 1.0, environ={"F": "nan"}), "finite"),
        (lambda: env_list("L", [], environ={"L": "a,,b"}), "no empty items"),
        (
            lambda: env_choice("P", ("fgd", "best-fit", "first-fit"), environ={"P": " fast "}),
            "P='fast': expected fgd, best-fit or first-fit",
        ),
        (lambda: env_choice("C", ("walltime", "stepwise"), environ={"C": "x"}), "walltime or step"),
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
    assert env_choice("C", ("walltime", "stepwise"), environ={}) == "walltime"
    assert env_choice("C", ("walltime", "stepwise"), environ={"C": " "}) == "walltime"
    assert env_choice("C", ("walltime", "stepwise"), environ={"C": " stepwise "}) == "stepwise"


def test_settings_refuse_to_start_without_a_secret_key_when_not_debugging(tmp_path):
    env = {**os.environ, "BERTH_DEBUG": "false", "BERTH_DATA_DIR": str(tmp_path)}
    env.pop("BERTH_SECRET_KEY", None)
    result = subprocess.run(
        [sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='berth.settings'; django.setup()"],  # noqa: E501
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0
    assert "BERTH_SECRET_KEY is required" in result.stderr


STRONG_KEY = "settings-test-key-" + "s3t" * 20


def run_manage(*args: str, **env_overrides: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BERTH_SECRET_KEY": STRONG_KEY, "BERTH_DEBUG": "false"}
    for name, value in env_overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# Deployment checks are Django's `security` tag; not even a warning is left among them.
DEPLOY_CHECK = ("check", "--deploy", "--tag", "security", "--fail-level", "WARNING")


def test_check_deploy_passes_behind_a_tls_proxy_with_a_strong_key():
    assert run_manage("check", "--deploy", BERTH_SECURE_PROXY="1").returncode == 0
    result = run_manage(*DEPLOY_CHECK, BERTH_SECURE_PROXY="1")
    assert result.returncode == 0, result.stderr


def test_check_deploy_fails_without_the_tls_settings():
    result = run_manage(*DEPLOY_CHECK, BERTH_SECURE_PROXY="0")
    assert result.returncode != 0
    assert "SECURE_HSTS_SECONDS" in result.stderr


def test_the_tls_proxy_settings_redirect_and_mark_cookies_secure():
    show = (
        "from django.conf import settings as s;"
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
        " s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER)"
    )
    result = run_manage("shell", "-c", show, BERTH_SECURE_PROXY="1", BERTH_HSTS_SECONDS="600")
    assert result.stdout.split("\n")[-2] == "True True True 600 ('HTTP_X_FORWARDED_PROTO', 'https')"


@pytest.mark.parametrize(
    "key", ["short-key", "bench", "django-insecure-" + "a" * 50, "ab" * 40, "x" * 60]
)
def test_a_weak_secret_key_is_refused_when_not_debugging(key):
    result = run_manage("check", BERTH_SECRET_KEY=key)
    assert result.returncode != 0
    assert "BERTH_SECRET_KEY is too weak" in result.stderr


def test_a_weak_secret_key_is_allowed_while_debugging():
    assert run_manage("check", BERTH_SECRET_KEY="short", BERTH_DEBUG="true").returncode == 0


def test_the_database_pool_is_sized_from_the_environment():
    show = (
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        "print(d['CONN_MAX_AGE'], d['OPTIONS']['pool'], d['OPTIONS']['application_name'])"
    )
    result = run_manage(
        "shell", "-c", show,
        DATABASE_URL="postgres://u@db:5432/berth", BERTH_DB_POOL_MAX="7",
        BERTH_DB_POOL_TIMEOUT="2.5", BERTH_DB_APPLICATION_NAME="berth-web",
    )  # fmt: skip
    assert result.stdout.split("\n")[-2] == (
        "0 {'min_size': 1, 'max_size': 7, 'timeout': 2.5, 'max_idle': 60.0} berth-web"
    ), result.stderr


def test_a_pool_min_above_its_max_is_refused():
    result = run_manage(
        "check", DATABASE_URL="postgres://u@db:5432/b", BERTH_DB_POOL_MAX="2", BERTH_DB_POOL_MIN="3"
    )
    assert result.returncode != 0
    assert "BERTH_DB_POOL_MIN=3 is larger than BERTH_DB_POOL_MAX=2" in result.stderr
