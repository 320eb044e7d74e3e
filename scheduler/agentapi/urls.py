from __future__ import annotations

from django.urls import path

from scheduler.agentapi import views

urlpatterns = [
    path("register/", views.RegisterView.as_view(), name="agent-register"),
    path("report/", views.ReportView.as_view(), name="agent-report"),
    path("lease/", views.lease_view, name="agent-lease"),
    path("heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("tasks/<int:task_id>/log/", views.AgentTaskLogView.as_view(), name="agent-task-log"),
]
