from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import URLPattern, path, re_path

from dashboard import consumers, shell
from scheduler.agentapi.terminal import AgentTerminalConsumer

# Close code for a socket path Berth does not serve (4000-4999 are the application's).
UNKNOWN_PATH_CLOSE_CODE = 4404


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Refuses the handshake for any other path, instead of the router raising (a 500)."""

    async def connect(self) -> None:
        await self.close(code=UNKNOWN_PATH_CLOSE_CODE)


websocket_urlpatterns: list[URLPattern] = [
    path("ws/cluster/", consumers.ClusterConsumer.as_asgi()),
    path("ws/jobs/", consumers.JobListConsumer.as_asgi()),
    path("ws/me/jobs/", consumers.MyJobsConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", consumers.JobConsumer.as_asgi()),
    path("ws/flows/", consumers.FlowListConsumer.as_asgi()),
    path("ws/flows/<int:flow_id>/", consumers.FlowConsumer.as_asgi()),
    # Terminal sessions (docs/interactive.md): the user's end and the node agent's end.
    path("ws/jobs/<int:job_id>/shell/", shell.ShellConsumer.as_asgi()),
    path("ws/agent/sessions/<str:session>/", AgentTerminalConsumer.as_asgi()),
    # Last: whatever the routes above did not match.
    re_path(r"", UnknownPathConsumer.as_asgi()),
]
