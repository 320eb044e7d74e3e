from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from berth.web.metrics import metrics
from scheduler.ops.health import healthz

# A request starved of database connections gets 503 + Retry-After, wherever it failed.
handler500 = "berth.web.overload.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("healthz/", healthz),
    path("metrics", metrics, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("scheduler.api.ops_urls")),
    path("api/v1/", include("scheduler.api.urls")),
    path("api/v1/agent/", include("scheduler.agentapi.urls")),
    path("", include("dashboard.urls")),
]
