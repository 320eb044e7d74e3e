"""Small helpers that read settings from the environment and fail loudly on bad values."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


class ImproperlyConfiguredEnv(ValueError):
    """A setting in the environment has a value Berth cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(
        f"{name}={raw!r}: expected one of true/false, yes/no, on/off, 1/0"
    )


def env_int(
    name: str,
    default: int,
    minimum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected a whole number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: must be at least {minimum}")
    return value


def env_float(
    name: str,
    default: float,
    minimum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(value):  # nan, inf: no setting means "for ever" this way
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: must be a finite number")
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: must be a number of at least {minimum}")
    return value


def env_list(name: str, default: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: a comma-separated list with no empty items")
    return items


def env_choice(
    name: str, choices: tuple[str, ...], environ: Mapping[str, str] | None = None
) -> str:
    """One of `choices`; the first where `name` is unset or blank."""
    environ = os.environ if environ is None else environ
    value = (environ.get(name) or "").strip() or choices[0]
    if value not in choices:
        expected = f"{', '.join(choices[:-1])} or {choices[-1]}" if choices[1:] else choices[0]
        raise ImproperlyConfiguredEnv(f"{name}={value!r}: expected {expected}")
    return value


def env_url(
    name: str,
    schemes: tuple[str, ...],
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Return the URL in `name`, or None when unset; reject a URL of another scheme."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme.lower() not in schemes or not rest:
        expected = ", ".join(f"{s}://" for s in schemes)
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected a URL starting with {expected}")
    return raw


def env_rate(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """A request rate as DRF's throttles read it: `N/second|minute|hour|day`."""
    environ = os.environ if environ is None else environ
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    count, sep, period = raw.partition("/")
    if not sep or not count.isdigit() or int(count) < 1 or period[:1] not in ("s", "m", "h", "d"):
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected a rate such as 20/minute")
    return raw
