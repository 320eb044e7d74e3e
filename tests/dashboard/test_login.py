"""Sign-in: every page needs it; the login page signs people in."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db
PAGES = ["/", "/jobs/", "/jobs/1/", "/flows/", "/flows/1/", "/queues/", "/nodes/", "/submit/"]


@pytest.mark.parametrize("url", PAGES)
def test_it_sends_anonymous_visitors_to_the_login_page(url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={url}"


def test_it_signs_in_with_a_password_and_goes_where_asked(owner):
    client = Client()
    page = client.get("/accounts/login/?next=/jobs/").content.decode()
    assert 'name="username"' in page and 'name="next" value="/jobs/"' in page
    form = {"username": "alice", "password": "alice-pass-123", "next": "/jobs/"}
    response = client.post("/accounts/login/", form)
    assert response.status_code == 302 and response["Location"] == "/jobs/"
    assert client.get("/jobs/").status_code == 200


def test_it_says_so_when_the_password_is_wrong(owner):
    response = Client().post("/accounts/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200 and "Wrong username or password" in response.content.decode()


def test_every_page_carries_the_csrf_token_for_htmx(owner, signed_in):
    html = signed_in(owner).get("/").content.decode()
    assert '<body hx-headers=\'{"X-CSRFToken": "' in html
    assert "vendor/htmx-2.0" in html and "vendor/htmx-ext-ws-2.0" in html
