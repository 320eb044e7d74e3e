"""Untrusted input, parsed with bounds: the checks every request body and the dashboard's
submit form go through before any validation of meaning (scheduler/api/parsers.py wraps
them for DRF; dashboard/views.py calls `load_yaml` for the form).

`check_tree` walks a parsed tree without recursion: nesting depth, string keys, no NUL or
lone surrogate in any string (neither can be stored, and a surrogate breaks every page that
renders it), integers that fit 64 bits, finite floats; a bad value is named by its path
(`tasks.0.env.FOO`). `load_yaml` refuses YAML anchors and aliases before anything is built:
an alias is a shared reference that whatever walks, echoes or stores the result expands, so
ten lines can become gigabytes. Messages are shortened, so a huge input is never echoed
back. Limits: docs/limits.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from django.conf import settings

# Used when DATA_UPLOAD_MAX_MEMORY_SIZE is None (Django's own default is 2.5 MB).
DEFAULT_BODY_BYTES = 2_621_440
MAX_ERRORS = 20  # per request: enough to fix a spec, never a flood
INT_RANGE = 2**63  # what the database's bigint holds
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


class BadInput(ValueError):
    """Input refused before any validation of its meaning; `errors` maps paths to reasons."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items()))
        self.errors = errors


class NotYAML(BadInput):
    """The text is not YAML at all (a syntax error), as opposed to YAML Berth refuses."""


def shorten(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, so an error never echoes a huge input."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def body_limit() -> int:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return DEFAULT_BODY_BYTES if limit is None else int(limit)


def _show_key(key: object) -> str:
    text = key if isinstance(key, str) else repr(key)
    if _BAD_TEXT.search(text):
        text = ascii(text)[1:-1]
    return shorten(text, 64)


def _children(value: object, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield (f"{path}.{_show_key(key)}" if path else _show_key(key)), item
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (f"{path}.{i}" if path else str(i)), item


def check_tree(data: object, *, raw_text: frozenset[str] = frozenset()) -> None:
    """Refuse, with each path, what no field of Berth may hold; `raw_text` names top-level
    string fields that may carry NUL or surrogates because their view replaces them (task
    output)."""
    max_depth = settings.BERTH_MAX_INPUT_DEPTH
    errors: dict[str, list[str]] = {}
    stack: list[tuple[str, object, int]] = [("", data, 0)]
    while stack and len(errors) < MAX_ERRORS:
        path, value, depth = stack.pop()
        where = path or "body"
        if depth > max_depth:
            raise BadInput({where: [f"nested deeper than {max_depth} levels"]})
        if isinstance(value, str):
            if _BAD_TEXT.search(value) and path not in raw_text:
                errors[where] = ["must not contain NUL characters or lone surrogates"]
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -INT_RANGE <= value < INT_RANGE:
                errors[where] = ["number out of range"]
        elif isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                errors[where] = ["must be a finite number"]
        elif isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    errors[where] = [f"keys must be strings, got {shorten(repr(key), 60)}"]
                elif _BAD_TEXT.search(key):
                    errors[where] = ["keys must not contain NUL characters or lone surrogates"]
            stack.extend((child, item, depth + 1) for child, item in _children(value, path))
        elif isinstance(value, list):
            stack.extend((child, item, depth + 1) for child, item in _children(value, path))
        else:
            errors[where] = [f"unsupported value of type {type(value).__name__}"]
    if errors:
        raise BadInput(errors)


class _JSONTypesLoader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):  # type: ignore[misc]
    """YAML's safe loader, building only what JSON could say: no timestamps, sets, binary."""


_NOT_JSON = {f"tag:yaml.org,2002:{t}" for t in ("timestamp", "binary", "set", "omap", "pairs")}
_JSONTypesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NOT_JSON]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JSONTypesLoader.yaml_constructors = {
    tag: fn for tag, fn in yaml.SafeLoader.yaml_constructors.items() if tag not in _NOT_JSON
}


def _check_yaml_events(text: str) -> None:
    """One pass over the parser's events (no objects built): refuse anchors, aliases and
    nesting past the limit, so the loader afterwards can neither blow up nor recurse deep."""
    max_depth = settings.BERTH_MAX_INPUT_DEPTH
    depth = 0
    for event in yaml.parse(text, Loader=_JSONTypesLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise BadInput({"body": ["YAML anchors and aliases (&, *) are not accepted"]})
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise BadInput({"body": [f"nested deeper than {max_depth} levels"]})
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_yaml(text: str, *, raw_text: frozenset[str] = frozenset()) -> Any:
    """A YAML document (a request body, the dashboard's submit form) as JSON types, with the
    bounds above; BadInput otherwise."""
    if len(text) > body_limit():
        raise BadInput({"body": [f"larger than {body_limit()} bytes"]})
    try:
        _check_yaml_events(text)
        data = yaml.load(text, Loader=_JSONTypesLoader)  # noqa: S506 (safe: JSON types only)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        if isinstance(exc, BadInput):
            raise
        raise NotYAML({"body": [shorten(f"not valid YAML: {exc}")]}) from None
    data = {} if data is None else data
    check_tree(data, raw_text=raw_text)
    return data
