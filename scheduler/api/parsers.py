"""YAML request bodies (`Content-Type: application/yaml`), parsed safely."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser


class YAMLParser(BaseParser):
    media_type = "application/yaml"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            data = yaml.safe_load(stream.read())
        except yaml.YAMLError as exc:
            raise ParseError(f"YAML parse error: {exc}") from None
        return {} if data is None else data
