from __future__ import annotations

from rest_framework.routers import DefaultRouter

from scheduler.api import schema, views

router = DefaultRouter()
router.register("queues", views.QueueViewSet, basename="queue")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("templates", views.TemplateViewSet, basename="template")
router.register("jobs", views.JobViewSet, basename="job")
router.register("flows", views.FlowViewSet, basename="flow")
router.register("events", views.EventViewSet, basename="event")

urlpatterns = router.urls
__all__ = ["schema", "urlpatterns"]  # schema registers its OpenAPI extensions on import
