"""The API's token authentication. Kept apart from the views: DRF reads this class from
settings while importing its own views, so this module must not import them."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from scheduler.ops.tokens import KeyRefused, user_for_key

MAX_KEY_LENGTH = 200


class ApiTokenAuthentication(BaseAuthentication):
    """`Authorization: Token <key>` or `Authorization: Bearer <key>`: a self-service token
    (stored hashed) or a DRF authtoken key. Any other scheme is left to the next class."""

    keywords = (b"token", b"bearer")

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Authorization header: expected '<scheme> <key>'")
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("invalid token") from None
        if len(key) > MAX_KEY_LENGTH:
            raise AuthenticationFailed("invalid token")
        try:
            found = user_for_key(key)
        except KeyRefused as exc:
            raise AuthenticationFailed(str(exc)) from None
        if found is None:
            raise AuthenticationFailed("invalid token")
        return found

    def authenticate_header(self, request: Request) -> str:
        return "Token"  # makes DRF answer 401 (with WWW-Authenticate), not 403
