"""ASGI entry point: HTTP through Django behind the request limits (middleware and view in
one thread hop: berth/web/handler.py), websockets through Channels with login checks.
`./run serve` runs it in several worker processes."""

from __future__ import annotations

import os
from typing import Any

from berth.web.handler import SharedThreads, get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "berth.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from berth.web.limits import RequestLimits  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from scheduler.agentapi.views import LeaseApp  # noqa: E402

# Agents' held lease requests skip the middleware stack (scheduler/agentapi/views.py), and run
# their database calls on two threads kept for the process's life (berth/web/handler.py).
lease_app: Any = SharedThreads(LeaseApp(), size=2)
django_app: Any = django_asgi_app
http_routes = [path("api/v1/agent/lease/", lease_app), re_path(r"", django_app)]

application = ProtocolTypeRouter(
    {
        "http": RequestLimits(URLRouter(http_routes)),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
