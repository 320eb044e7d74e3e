"""API routes for operations: self-service tokens and usage accounting."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler.api import shares, tokens, usage

router = SimpleRouter()
router.register("tokens", tokens.TokenViewSet, basename="token")
router.register("shares", shares.UserShareViewSet, basename="share")

urlpatterns = [
    path("usage/", usage.UsageView.as_view(), name="usage"),
    path("usage/shares/", shares.SharesView.as_view(), name="usage-shares"),
    *router.urls,
]
