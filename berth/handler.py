"""Django's ASGI handler with the middleware chain and the view in one thread hop.

Django's own ASGI handler runs its middleware in async mode. Most of them (sessions, CSRF,
auth, messages, security, common, clickjacking) are sync `MiddlewareMixin` classes, which
in async mode run each of their `process_request`/`process_response` through
`sync_to_async`: about a dozen handoffs between the event loop and the request's thread for
every request, before and after the sync view's own. Measured under `bench/e2e.py`, those
handoffs were a large part of a web worker's CPU per submission (docs/benchmarks.md).

Every view this handler serves is sync (the agents' held leases, the one async view, have
an app of their own: scheduler/agent/views.py), so here the whole chain is built in sync mode,
as under WSGI, and runs in one `sync_to_async` call in the request's own thread (Django's
ThreadSensitiveContext, so the connection closers of `request_finished` run in that same
thread). Request parsing, signals, disconnects and streaming stay Django's.
"""

from __future__ import annotations

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> OneHopASGIHandler:
    """As `django.core.asgi.get_asgi_application`, with the one-hop handler."""
    django.setup(set_prefix=False)
    return OneHopASGIHandler()
