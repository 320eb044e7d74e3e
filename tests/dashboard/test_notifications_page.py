"""The notifications page: your defaults (events, email, webhook) saved with the same checks
as the API; a webhook host staff do not allow is refused and not saved."""

from __future__ import annotations

import pytest

from scheduler.models import NotifyPreference

pytestmark = pytest.mark.django_db


def test_it_shows_and_saves_your_defaults(signed_in, owner, settings):
    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.org"]
    client = signed_in(owner)
    page = client.get("/notifications/")
    assert page.status_code == 200 and b"time_limit_80" in page.content
    secret = NotifyPreference.objects.get(user=owner).webhook_secret
    assert secret.encode() in page.content
    assert page["Cache-Control"] == "no-store"  # the secret is on the page
    url = "https://hooks.example.org/x"
    form = {"events": ["end", "begin"], "email": "on", "webhook_url": url}
    saved = client.post("/notifications/", form)
    assert saved.status_code == 200 and b"Saved." in saved.content
    pref = NotifyPreference.objects.get(user=owner)
    assert (pref.events, pref.email, pref.webhook_url) == ("begin,end", True, url)


def test_a_disallowed_host_or_event_is_refused_and_nothing_saved(signed_in, owner, settings):
    settings.BERTH_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.org"]
    client = signed_in(owner)
    bad = client.post("/notifications/", {"events": ["end"], "webhook_url": "http://10.0.0.1/"})
    assert bad.status_code == 400 and b"not allowed for webhooks" in bad.content
    odd = client.post("/notifications/", {"events": ["later"]})
    assert odd.status_code == 400 and b"unknown event" in odd.content
    pref = NotifyPreference.objects.get(user=owner)
    assert (pref.events, pref.webhook_url) == ("", "")


def test_it_needs_a_signed_in_user(client):
    assert client.get("/notifications/").status_code == 302
