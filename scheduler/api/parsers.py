"""Request bodies (JSON, YAML with `Content-Type: application/yaml`, forms), parsed with bounds.

Every parser reads at most the body limit (413 beyond it), then checks the parsed tree without
recursion: nesting depth, string keys, no NUL or lone surrogate in any string (neither can be
stored, and a surrogate breaks every page that renders it), integers that fit 64 bits, finite
floats. A bad value is a 400 naming its path (`tasks.0.env.FOO`). YAML anchors and aliases are
refused before anything is built: an alias is a shared reference that whatever walks, echoes or
stores the result expands, so ten lines can become gigabytes. Error messages are shortened, so
a huge input is never echoed back. Limits: docs/limits.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import IO, Any

import yaml
from django.conf import settings
from django.http import QueryDict
from rest_framework import parsers, status
from rest_framework.exceptions import APIException, ParseError, ValidationError

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


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "payload_too_large"


def shorten(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, so an error never echoes a huge input."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def body_limit() -> int:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return DEFAULT_BODY_BYTES if limit is None else int(limit)


def read_body(stream: IO[Any] | None, parser_context: Mapping[str, Any] | None) -> bytes:
    """The raw body, refused with 413 past the limit before it is read into memory."""
    limit = body_limit()
    request = (parser_context or {}).get("request")
    declared = getattr(request, "META", {}).get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    return raw if isinstance(raw, bytes) else str(raw).encode()


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


def _raw_text_fields(parser_context: Mapping[str, Any] | None) -> frozenset[str]:
    view = (parser_context or {}).get("view")
    return frozenset(getattr(view, "raw_text_fields", ()))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


class JSONParser(parsers.JSONParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_body(stream, parser_context)
        try:
            data = json.loads(raw, parse_constant=_refuse_constant)
        except RecursionError:
            raise ValidationError(
                {"body": [f"nested deeper than {settings.BERTH_MAX_INPUT_DEPTH} levels"]}
            ) from None
        except ValueError as exc:  # also UnicodeDecodeError and NaN/Infinity
            raise ParseError(shorten(f"JSON parse error: {exc}")) from None
        try:
            check_tree(data, raw_text=_raw_text_fields(parser_context))
        except BadInput as exc:
            raise ValidationError(exc.errors) from None
        return data


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


class YAMLParser(parsers.BaseParser):
    media_type = "application/yaml"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_body(stream, parser_context)
        try:
            return load_yaml(raw.decode(), raw_text=_raw_text_fields(parser_context))
        except UnicodeDecodeError:
            raise ParseError("not valid YAML: the body is not UTF-8") from None
        except NotYAML as exc:  # like a JSON syntax error: under `detail`
            raise ParseError(exc.errors["body"][0]) from None
        except BadInput as exc:
            raise ValidationError(exc.errors) from None


def _form_tree(data: QueryDict) -> dict[str, object]:
    """Form fields as check_tree walks them: a field given once is its value (named `name`)."""
    return {key: (v[0] if len(v) == 1 else v) for key, v in data.lists()}


class FormParser(parsers.FormParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        data = QueryDict(read_body(stream, parser_context), encoding=encoding)
        try:
            check_tree(_form_tree(data))
        except BadInput as exc:
            raise ValidationError(exc.errors) from None
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        request = (parser_context or {}).get("request")
        declared = getattr(request, "META", {}).get("CONTENT_LENGTH") or "0"
        if not declared.isdigit() or int(declared) > body_limit():
            raise PayloadTooLarge(f"request body larger than {body_limit()} bytes")
        result = super().parse(stream, media_type, parser_context)
        try:
            check_tree(_form_tree(result.data))
        except BadInput as exc:
            raise ValidationError(exc.errors) from None
        return result
