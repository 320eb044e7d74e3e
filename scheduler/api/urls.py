from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from scheduler.api import account, schema, views

router = DefaultRouter()
router.register("queues", views.QueueViewSet, basename="queue")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("templates", views.TemplateViewSet, basename="template")
router.register("jobs", views.JobViewSet, basename="job")
router.register("flows", views.FlowViewSet, basename="flow")
router.register("events", views.EventViewSet, basename="event")

urlpatterns = [path("me/", account.MeView.as_view(), name="me"), *router.urls]
__all__ = ["schema", "urlpatterns"]  # schema registers its OpenAPI extensions on import
