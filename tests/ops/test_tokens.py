"""Self-service API tokens: /api/v1/tokens/, the token page, and signing in with a key."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.models import ApiToken, hash_token

pytestmark = pytest.mark.django_db

# Each test signs in from its own address so throttle counts (kept in the shared cache) of
# one test or run never reach another.


def _addr() -> str:
    n = uuid.uuid4().int
    return f"10.{n % 250}.{(n >> 8) % 250}.{(n >> 16) % 250 + 1}"


def _client(key: str | None = None, scheme: str = "Token") -> APIClient:
    client = APIClient(REMOTE_ADDR=_addr())
    if key:
        client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    return client


def _login(username: str, password: str, name: str = "laptop") -> str:
    response = _client().post(
        "/api/v1/tokens/", {"username": username, "password": password, "name": name},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return str(response.json()["token"])


def test_it_trades_a_password_for_a_token_that_signs_in(owner):
    response = _client().post(
        "/api/v1/tokens/",
        {"username": "alice", "password": "alice-pass-123", "name": "laptop"},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "prefix", "created_at", "last_used_at", "expires_at",
                         "token"}  # fmt: skip
    key = body["token"]
    assert key.startswith(body["prefix"]) and body["name"] == "laptop"
    for scheme in ("Token", "Bearer"):
        jobs = _client(key, scheme).get("/api/v1/jobs/")
        assert jobs.status_code == 200, jobs.content
    assert ApiToken.objects.get(pk=body["id"]).last_used_at is not None


def test_it_stores_only_the_hash_of_the_key(owner):
    key = _login("alice", "alice-pass-123")
    row = ApiToken.objects.get(user=owner)
    assert row.key_hash == hash_token(key)
    stored = [str(v) for v in ApiToken.objects.values_list(flat=False).get(pk=row.pk)]
    assert not any(key in value for value in stored)


def test_a_wrong_password_or_user_says_neither(owner):
    bad_password = _client().post(
        "/api/v1/tokens/", {"username": "alice", "password": "nope", "name": "x"}, format="json"
    )
    no_user = _client().post(
        "/api/v1/tokens/", {"username": "nobody", "password": "nope", "name": "x"}, format="json"
    )
    assert bad_password.status_code == no_user.status_code == 401
    assert bad_password.json() == no_user.json() == {"detail": "invalid username or password"}
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"username": "alice", "password": "alice-pass-123"}, "name"),
        ({"username": "alice", "name": "x"}, "password"),
        ({"username": "alice", "password": "alice-pass-123", "name": "x" * 101}, "name"),
        (
            {
                "username": "alice",
                "password": "alice-pass-123",
                "name": "x",
                "expires_at": "2001-01-01T00:00:00Z",
            },
            "expires_at",
        ),  # fmt: skip
        (
            {"username": "alice", "password": "alice-pass-123", "name": "x", "expires_at": "soon"},
            "expires_at",
        ),  # fmt: skip
    ],
)
def test_a_bad_request_names_the_field(owner, body, field):
    response = _client().post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_anonymous_without_credentials_is_refused(owner):
    response = _client().post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 401
    assert _client().get("/api/v1/tokens/").status_code == 401


def test_a_signed_in_user_lists_only_their_tokens_without_keys(api, owner, teammate):
    key = _login("alice", "alice-pass-123", "laptop")
    _login("bob", "bob-pass-123", "bob-ci")
    made = _client(key).post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert made.status_code == 201
    listed = _client(key).get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci", "laptop"]
    assert all("token" not in t for t in listed)


def test_a_revoked_token_no_longer_signs_in(owner):
    key = _login("alice", "alice-pass-123")
    token_id = ApiToken.objects.get(user=owner).pk
    assert _client(key).delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    assert _client(key).get("/api/v1/jobs/").status_code == 401
    assert not ApiToken.objects.exists()


def test_another_users_token_is_untouchable(owner, teammate):
    alice_key = _login("alice", "alice-pass-123")
    bob_key = _login("bob", "bob-pass-123")
    bob_token = ApiToken.objects.get(user=teammate).pk
    assert _client(alice_key).delete(f"/api/v1/tokens/{bob_token}/").status_code == 404
    assert _client(alice_key).delete("/api/v1/tokens/x/").status_code == 404
    assert _client(bob_key).get("/api/v1/jobs/").status_code == 200


def test_an_expired_token_is_refused(owner):
    key = _login("alice", "alice-pass-123")
    ApiToken.objects.update(expires_at="2000-01-01T00:00:00Z")
    response = _client(key).get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json()["detail"] == "token expired"


def test_an_unknown_key_is_refused_and_drf_authtoken_keys_still_work(owner):
    assert _client("berth_not-a-real-key").get("/api/v1/jobs/").status_code == 401
    call_command("drf_create_token", "alice", verbosity=0)
    legacy = Token.objects.get(user=owner).key
    assert _client(legacy).get("/api/v1/jobs/").status_code == 200


def test_token_creation_is_throttled(owner, settings):
    settings.BERTH_TOKEN_CREATE_RATE = "3/minute"
    client = _client()
    body = {"username": "alice", "password": "wrong", "name": "x"}
    codes = [client.post("/api/v1/tokens/", body, format="json").status_code for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    last = client.post("/api/v1/tokens/", body, format="json")
    assert last.status_code == 429 and int(last["Retry-After"]) > 0
    # Another address is not affected; nor is listing.
    assert _client().post("/api/v1/tokens/", body, format="json").status_code == 401


# --- the page -----------------------------------------------------------------------------


def _browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_creates_shows_the_key_once_and_revokes(owner):
    page = _browser(owner)
    made = page.post("/tokens/", {"name": "laptop"}, HTTP_HX_REQUEST="true")
    assert made.status_code == 200
    row = ApiToken.objects.get(user=owner)
    html = made.content.decode()
    key = html.split('id="new-token-key" class="mono">')[1].split("<")[0]
    assert hash_token(key) == row.key_hash
    assert _client(key).get("/api/v1/jobs/").status_code == 200
    again = page.get("/tokens/").content.decode()
    assert "laptop" in again and key not in again and row.prefix in again
    revoked = page.post(f"/tokens/{row.pk}/revoke/", HTTP_HX_REQUEST="true")
    assert revoked.status_code == 200 and "No tokens yet." in revoked.content.decode()
    assert _client(key).get("/api/v1/jobs/").status_code == 401


def test_the_page_names_a_bad_name(owner):
    response = _browser(owner).post("/tokens/", {"name": "  "})
    assert response.status_code == 400
    assert "<code>name</code>" in response.content.decode()


def test_the_page_cannot_revoke_another_users_token(owner, teammate):
    _login("bob", "bob-pass-123")
    bob_token = ApiToken.objects.get(user=teammate).pk
    assert _browser(owner).post(f"/tokens/{bob_token}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=bob_token).exists()


def test_the_page_is_in_the_nav_and_needs_sign_in(owner):
    assert Client().get("/tokens/").status_code == 302
    assert 'href="/tokens/"' in _browser(owner).get("/").content.decode()


@pytest.mark.parametrize("kind", ["self-service", "drf"])
def test_a_key_signs_in_as_its_own_user_whole_and_never_an_inactive_one(owner, teammate, kind):
    """Sign-in reads the token and its user in one statement: the user it yields is the
    token's own, with every field (staff or not), and a deactivated user is refused."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler.ops.tokens import KeyRefused, user_for_key

    teammate.is_staff = True
    teammate.save()
    if kind == "drf":
        call_command("drf_create_token", "bob", verbosity=0)
        key = Token.objects.get(user=teammate).key
    else:
        key = _login("bob", "bob-pass-123")
    _login("alice", "alice-pass-123")  # another user's token beside it
    user_for_key(key)  # the first use notes when the token was last used: a write
    with CaptureQueriesContext(connection) as queries:
        found = user_for_key(key)
    assert len(queries) == 1
    assert found is not None
    user, token = found
    assert isinstance(user, User)
    assert (user.pk, user.username, user.is_staff, token.user_id) == (
        teammate.pk, "bob", True, teammate.pk,
    )  # fmt: skip
    assert _client(key).get("/api/v1/jobs/").status_code == 200
    teammate.is_active = False
    teammate.save()
    with pytest.raises(KeyRefused):
        user_for_key(key)
    assert _client(key).get("/api/v1/jobs/").status_code == 401
