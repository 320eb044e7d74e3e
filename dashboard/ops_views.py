"""Operator and self-service pages: API tokens (and usage, below)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from scheduler.models import ApiToken
from scheduler.tokens import TokenError, create_token, revoke_token


def _htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


def _tokens_context(request: HttpRequest, **extra: object) -> dict[str, object]:
    user: Any = request.user  # signed in (login_required)
    rows = ApiToken.objects.filter(user=user).order_by("-id")
    return {"tokens": rows, "new_key": "", "new_token": None, "errors": {}, **extra}


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    """List your tokens; POST makes one and shows its key this once."""
    if request.method == "POST":
        name = request.POST.get("name", "")
        try:
            token, key = create_token(request.user, name)
        except TokenError as exc:
            context = _tokens_context(request, errors=exc.errors, name=name)
            # htmx swaps only 2xx answers: the form comes back with its errors inline.
            return render(request, _page(request), context, status=200 if _htmx(request) else 400)
        context = _tokens_context(request, new_key=key, new_token=token)
    else:
        context = _tokens_context(request)
    return render(request, _page(request), context)


def _page(request: HttpRequest) -> str:
    return "dashboard/tokens.html#tokens-panel" if _htmx(request) else "dashboard/tokens.html"


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not revoke_token(request.user, token_id):
        raise Http404("no such token")  # another user's token looks like no token at all
    if _htmx(request):
        return render(request, _page(request), _tokens_context(request))
    return redirect("dashboard:tokens")
