"""Request bodies (JSON, YAML with `Content-Type: application/yaml`, forms), parsed with bounds.

Every parser reads at most the body limit (413 beyond it), then checks the parsed tree with
scheduler/intake/inputs.py (depth, keys, text, numbers; YAML without anchors or
aliases): a bad value is a 400 naming its path (`tasks.0.env.FOO`). Limits: docs/limits.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any, TypeAlias

from django.conf import settings
from django.http import QueryDict
from rest_framework import parsers, status
from rest_framework.exceptions import APIException, ParseError, ValidationError

from scheduler.intake.inputs import BadInput, NotYAML, body_limit, check_tree, load_yaml, shorten

# What DRF hands a parser besides the stream: the request, the view, the encoding.
Context: TypeAlias = Mapping[str, Any] | None


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "payload_too_large"


def read_body(stream: IO[Any] | None, parser_context: Context) -> bytes:
    """The raw body, refused with 413 past the limit before it is read into memory."""
    limit = body_limit()
    declared = _declared_length(parser_context)
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    return raw if isinstance(raw, bytes) else str(raw).encode()


def _declared_length(parser_context: Context) -> int | None:
    """The request's Content-Length (0 where it has none); None where it is not a number."""
    request = (parser_context or {}).get("request")
    declared = getattr(request, "META", {}).get("CONTENT_LENGTH") or "0"
    return int(declared) if declared.isdigit() else None


def checked(tree: object, parser_context: Context = None) -> None:
    """check_tree for a request: a refused value is a 400 naming its path. Top-level string
    fields the view names in `raw_text_fields` may carry NUL or surrogates (task output)."""
    try:
        check_tree(tree, raw_text=_raw_text_fields(parser_context))
    except BadInput as exc:
        raise ValidationError(exc.errors) from None


def _raw_text_fields(parser_context: Context) -> frozenset[str]:
    view = (parser_context or {}).get("view")
    return frozenset(getattr(view, "raw_text_fields", ()))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


class _WholeBodyParser(parsers.BaseParser):
    """A parser that reads the whole body within the limit (read_body), then parses it."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Context = None
    ) -> Any:
        return self.parse_body(read_body(stream, parser_context), parser_context)

    def parse_body(self, raw: bytes, parser_context: Context) -> Any:
        raise NotImplementedError


class JSONParser(_WholeBodyParser, parsers.JSONParser):
    def parse_body(self, raw: bytes, parser_context: Context) -> Any:
        try:
            data = json.loads(raw, parse_constant=_refuse_constant)
        except RecursionError:
            raise ValidationError(
                {"body": [f"nested deeper than {settings.BERTH_MAX_INPUT_DEPTH} levels"]}
            ) from None
        except ValueError as exc:  # also UnicodeDecodeError and NaN/Infinity
            raise ParseError(shorten(f"JSON parse error: {exc}")) from None
        checked(data, parser_context)
        return data


class YAMLParser(_WholeBodyParser):
    media_type = "application/yaml"

    def parse_body(self, raw: bytes, parser_context: Context) -> Any:
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


class FormParser(_WholeBodyParser, parsers.FormParser):
    def parse_body(self, raw: bytes, parser_context: Context) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        data = QueryDict(raw, encoding=encoding)
        checked(_form_tree(data))
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Context = None
    ) -> Any:
        declared = _declared_length(parser_context)
        if declared is None or declared > body_limit():
            raise PayloadTooLarge(f"request body larger than {body_limit()} bytes")
        result = super().parse(stream, media_type, parser_context)
        checked(_form_tree(result.data))
        return result
