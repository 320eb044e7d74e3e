from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from scheduler.api import account, flows, gpu_history, logs, schema, views

router = DefaultRouter()
router.register("queues", views.QueueViewSet, basename="queue")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("templates", views.TemplateViewSet, basename="template")
router.register("jobs", views.JobViewSet, basename="job")
router.register("flows", views.FlowViewSet, basename="flow")
router.register("events", views.EventViewSet, basename="event")

urlpatterns = [
    path("me/", account.MeView.as_view(), name="me"),
    path("me/notifications/", account.NotifyPreferenceView.as_view(), name="me-notifications"),
    path("nodes/<str:name>/gpu-history/", gpu_history.NodeGpuHistoryView.as_view(),
         name="node-gpu-history"),
    path("jobs/<int:job_id>/gpu-history/", gpu_history.JobGpuHistoryView.as_view(),
         name="job-gpu-history"),
    path("jobs/<int:job_id>/tasks/<int:task_id>/log/", logs.TaskAttemptLogView.as_view(),
         name="task-log"),
    path("jobs/<int:job_id>/resubmit/", flows.JobResubmitView.as_view(), name="job-resubmit"),
    path("flows/<int:flow_id>/retry/", flows.FlowRetryView.as_view(), name="flow-retry"),
    path("flows/<int:flow_id>/resubmit/", flows.FlowResubmitView.as_view(),
         name="flow-resubmit"),
    *router.urls,
]  # fmt: skip
__all__ = ["schema", "urlpatterns"]  # schema registers its OpenAPI extensions on import
