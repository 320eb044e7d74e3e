"""OpenAPI pieces drf-spectacular cannot work out by itself: how the schema (/api/schema/)
describes Berth's token authentications (imported by scheduler/api/urls.py and tokens.py)."""

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


class NodeTokenScheme(OpenApiAuthenticationExtension):
    """The agents' `Authorization: Node <token>` header, from `agent/register`."""

    target_class = "scheduler.agent.views.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'The node token from agent/register, sent as "Node <token>".',
        }
