"""Sign-in endpoints are throttled per address and per username, in the shared cache."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client


def fresh_address() -> str:
    # Counts live in Redis, shared with any server a test starts: own addresses keep them apart.
    n = uuid.uuid4().int
    return f"10.{n % 250}.{n // 250 % 250}.{n // 62500 % 250 + 1}"


@pytest.fixture
def member(db) -> User:
    # ...and with its own username, for the same reason.
    return User.objects.create_user(f"user-{uuid.uuid4().hex[:8]}", password="member-pass-123")


@pytest.fixture
def attempts(settings):
    settings.BERTH_LOGIN_ATTEMPTS = 3
    settings.BERTH_LOGIN_WINDOW_SECONDS = 60
    return 3


def test_failed_logins_past_the_limit_get_429_with_retry_after(member, attempts):
    client = Client(REMOTE_ADDR=fresh_address())
    for _ in range(attempts):
        response = client.post("/accounts/login/", {"username": member.username, "password": "x"})
        assert response.status_code == 200  # the form again, with its error
    right = {"username": member.username, "password": "member-pass-123"}
    response = client.post("/accounts/login/", right)
    assert response.status_code == 429
    assert response["Retry-After"] == "60"
    assert "too many sign-in attempts" in response.json()["detail"]


def test_one_username_is_throttled_whatever_the_address(member, attempts):
    name = member.username
    for _ in range(attempts):
        Client(REMOTE_ADDR=fresh_address()).post(
            "/accounts/login/", {"username": name, "password": "x"}
        )
    response = Client(REMOTE_ADDR=fresh_address()).post(
        "/accounts/login/", {"username": name, "password": "x"}
    )
    assert response.status_code == 429


def test_successful_sign_ins_are_not_counted(member, attempts):
    client = Client(REMOTE_ADDR=fresh_address())
    for _ in range(attempts + 2):
        response = client.post(
            "/accounts/login/", {"username": member.username, "password": "member-pass-123"}
        )
        assert response.status_code == 302
        client.logout()


def test_join_token_guesses_are_throttled(db, attempts, settings):
    settings.BERTH_JOIN_TOKEN = "the-real-join-token"
    client = Client(REMOTE_ADDR=fresh_address())
    body = {"name": "n1", "cpu": 4, "memory": 1 << 30, "gpus": []}
    statuses = [
        client.post(
            "/api/v1/agent/register/", body, content_type="application/json",
            headers={"Authorization": f"Bearer guess-{i}"},
        ).status_code
        for i in range(attempts + 1)
    ]  # fmt: skip
    assert statuses[-1] == 429
    assert all(400 <= status < 500 for status in statuses[:-1])
