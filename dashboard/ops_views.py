"""Operator and self-service pages: API tokens, notification defaults and usage."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from scheduler.cycle.fairshare import share_rows, weights
from scheduler.intake.specs import NOTIFY_EVENTS, notify_events, webhook_url_problem
from scheduler.models import ApiToken, NotifyPreference, UsageRecord
from scheduler.ops.accounting import UsageQueryError, parse_usage_query, usage_rows
from scheduler.ops.tokens import TokenError, create_token, revoke_token


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


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    """Your notification defaults (docs/notifications.md): events for jobs whose spec has no
    `notify`, email on or off, a webhook URL (a host staff allow) and its signing secret."""
    pref = NotifyPreference.objects.get_or_create(user=request.user)[0]
    errors: dict[str, list[str]] = {}
    saved = False
    if request.method == "POST":
        events, problem = notify_events(request.POST.getlist("events"))
        url = request.POST.get("webhook_url", "").strip()
        if problem:
            errors["events"] = [problem]
        if url and (problem := webhook_url_problem(url)):
            errors["webhook_url"] = [problem]
        if not errors:
            pref.events, pref.webhook_url = ",".join(events), url
            pref.email = request.POST.get("email") == "on"
            pref.save()
            saved = True
    context = {
        "pref": pref,
        "chosen": notify_events(pref.events)[0],
        "events": NOTIFY_EVENTS,
        "errors": errors,
        "saved": saved,
        "email": getattr(request.user, "email", ""),
    }
    response = render(
        request, "dashboard/notifications.html", context, status=400 if errors else 200
    )
    response["Cache-Control"] = "no-store"  # it shows the webhook signing secret
    return response


@login_required
def usage(request: HttpRequest) -> HttpResponse:
    """GPU-hours per user and day over a window (your own; staff see everyone's)."""
    params = {k: request.GET.get(k, "").strip() for k in ("since", "until", "user")}
    context: dict[str, Any] = {"params": params, "errors": {}, "chart": None, "totals": []}
    try:
        since, until, _ = parse_usage_query(params, timezone.now())
    except UsageQueryError as exc:
        context["errors"] = exc.errors
        return render(request, "dashboard/usage.html", context, status=400)
    user: Any = request.user
    records = UsageRecord.objects.filter(finished_at__gte=since, finished_at__lt=until)
    if not user.is_staff:
        records = records.filter(user=user)
    elif params["user"]:
        records = records.filter(username=params["user"])
    last_day = (until - timedelta(microseconds=1)).date()
    context.update(
        since_value=params["since"] or since.date().isoformat(),
        until_value=params["until"] or last_day.isoformat(),
        chart=usage_chart(usage_rows(records, ["day", "user"]), since.date(), last_day),
        totals=usage_rows(records, ["user"]),
    )  # fmt: skip
    shares = share_rows()  # fair share now (sshare): your own line, everyone's for staff
    context["shares"] = shares if user.is_staff else [
        r for r in shares if r.user == user.get_username()
    ]  # fmt: skip
    context["factors_off"] = weights().off
    return render(request, "dashboard/usage.html", context)


def usage_chart(rows: list[dict[str, Any]], first: date, last: date) -> dict[str, Any]:
    """Series for the chart: one point per day in [first, last] for every user (0 when idle);
    x values are Unix times of midnight UTC, as uPlot expects."""
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    users = sorted({r["user"] for r in rows})
    hours = {(r["user"], r["day"]): r["gpu_hours"] for r in rows}
    return {
        "x": [int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()) for d in days],
        "series": [
            {"label": u, "values": [hours.get((u, d.isoformat()), 0) for d in days]} for u in users
        ],
    }
