"""Refuse URLs holding a NUL character before any view sees them: PostgreSQL cannot store or
even compare text with NUL, so a lookup like `?state=%00` or `/nodes/a%00/` would otherwise
end in a 500 (issue 11). A 400 names the part of the URL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware


def _refused(request: HttpRequest) -> HttpResponse | None:
    if "\x00" in request.path:
        return JsonResponse({"path": ["must not contain NUL characters"]}, status=400)
    if any(
        "\x00" in key or any("\x00" in value for value in values)
        for key, values in request.GET.lists()
    ):
        return JsonResponse({"query": ["must not contain NUL characters"]}, status=400)
    return None


@sync_and_async_middleware
def refuse_nul_in_urls(get_response: Callable[[HttpRequest], Any]) -> Any:
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            refused = _refused(request)
            if refused is not None:
                return refused
            response: Awaitable[HttpResponse] = get_response(request)
            return await response

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        refused = _refused(request)
        return refused if refused is not None else get_response(request)

    return middleware
