from __future__ import annotations

from django.urls import URLPattern, path

from dashboard import consumers

websocket_urlpatterns: list[URLPattern] = [
    path("ws/cluster/", consumers.ClusterConsumer.as_asgi()),
    path("ws/jobs/", consumers.JobListConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", consumers.JobConsumer.as_asgi()),
    path("ws/flows/<int:flow_id>/", consumers.FlowConsumer.as_asgi()),
]
