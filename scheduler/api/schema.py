"""OpenAPI pieces drf-spectacular cannot work out by itself (imported by scheduler/api/urls.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class NodeTokenScheme(OpenApiAuthenticationExtension):
    """The agents' `Authorization: Node <token>` header, from `agent/register`."""

    target_class = "scheduler.agent.views.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'The node token from agent/register, sent as "Node <token>".',
        }
