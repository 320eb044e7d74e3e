"""Self-service API tokens: issue, look up by key, revoke.

A key is shown once, when it is made; the database keeps only its sha256 (like node tokens),
so a leaked database dump holds no usable key. DRF's own authtoken keys (`manage.py
drf_create_token`) stay valid beside these.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from scheduler.models import API_TOKEN_PREFIX, ApiToken, hash_token
from scheduler.sql import token_with_user

MAX_TOKENS_PER_USER = 100
NAME_MAX = 100
# last_used_at is written at most this often per token, so a busy client does not turn
# every API call into a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class TokenError(ValueError):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


def clean_name(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise TokenError({"name": ["required: a short name such as 'laptop' or 'ci'"]})
    name = raw.strip()
    if len(name) > NAME_MAX:
        raise TokenError({"name": [f"at most {NAME_MAX} characters"]})
    if not name.isprintable():
        raise TokenError({"name": ["must not contain control characters"]})
    return name


def create_token(
    user: Any, name: object, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """A new token for `user`; returns the row and the key (the only time it is known)."""
    clean = clean_name(name)
    if expires_at is not None and expires_at <= timezone.now():
        raise TokenError({"expires_at": ["must be in the future"]})
    with transaction.atomic():
        # Lock the user's row so two concurrent requests cannot both pass the limit.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if ApiToken.objects.filter(user=user).count() >= MAX_TOKENS_PER_USER:
            raise TokenError(
                {"name": [f"you already have {MAX_TOKENS_PER_USER} tokens; revoke some first"]}
            )
        token = ApiToken(user=user, name=clean, expires_at=expires_at)
        key = token.issue_key()
        token.save()
    return token, key


def revoke_token(user: Any, token_id: int) -> bool:
    """Delete one of `user`'s own tokens; False if it is not theirs or does not exist."""
    deleted, _ = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return deleted > 0


TokenRow = TypeVar("TokenRow", bound=models.Model)


class KeyRefused(Exception):
    """A key that names a token, but one that may not be used (expired, user inactive)."""


def user_for_key(key: str, now: datetime | None = None) -> tuple[AbstractBaseUser, Any] | None:
    """The user a key signs in as and the token row, or None when no token has this key.
    Raises KeyRefused for an expired token or an inactive user."""
    now = now or timezone.now()
    # Self-service keys all start with API_TOKEN_PREFIX (DRF's are hex): one query either way.
    token = (
        token_with_user(ApiToken, "key_hash", hash_token(key))
        if key.startswith(API_TOKEN_PREFIX)
        else None
    )
    if token is not None:
        if token.expires_at is not None and token.expires_at <= now:
            raise KeyRefused("token expired")
        if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        user: AbstractBaseUser = token.user
        found: Any = token
    else:
        legacy = token_with_user(Token, "key", key)
        if legacy is None:
            return None
        user, found = legacy.user, legacy
    if not user.is_active:
        raise KeyRefused("user inactive or deleted")
    return user, found
