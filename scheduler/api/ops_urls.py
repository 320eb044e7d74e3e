"""API routes for operations: self-service tokens and usage accounting."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from scheduler.api import tokens

router = SimpleRouter()
router.register("tokens", tokens.TokenViewSet, basename="token")

urlpatterns = router.urls
