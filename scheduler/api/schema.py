"""How the OpenAPI schema (/api/schema/) describes Berth's token authentication."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "scheduler.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>` or `Bearer <key>`: a key from /api/v1/tokens/, the "
            "API tokens page or manage.py drf_create_token",
        }
