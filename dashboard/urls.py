from __future__ import annotations

from django.urls import path

from dashboard import ops_views, views

app_name = "dashboard"
urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:job_id>/", views.job, name="job"),
    path("jobs/<int:job_id>/elements/", views.job_elements, name="job-elements"),
    path("jobs/<int:job_id>/tasks/<int:task_id>/log/", views.job_task_log, name="task-log"),
    path("jobs/<int:job_id>/<str:action>/", views.job_action, name="job-action"),
    path("flows/", views.flows, name="flows"),
    path("flows/<int:flow_id>/", views.flow, name="flow"),
    path("flows/<int:flow_id>/cancel/", views.flow_cancel, name="flow-cancel"),
    path("flows/<int:flow_id>/retry/", views.flow_retry, name="flow-retry"),
    path("flows/<int:flow_id>/resubmit/", views.flow_resubmit, name="flow-resubmit"),
    path("queues/", views.queues, name="queues"),
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/<str:name>/", views.node, name="node"),
    path("nodes/<str:name>/<str:action>/", views.node_action, name="node-action"),
    path("submit/", views.submit, name="submit"),
    path("usage/", ops_views.usage, name="usage"),
    path("tokens/", ops_views.tokens, name="tokens"),
    path("notifications/", ops_views.notifications, name="notifications"),
    path("tokens/<int:token_id>/revoke/", ops_views.token_revoke, name="token-revoke"),
]
