"""Websockets: check login and ownership on connect, join the group, forward HTML."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from dashboard import presence
from scheduler import notify
from scheduler.models import Flow, Job


class _Live(AsyncWebsocketConsumer):
    groups_to_join: list[str]
    presence_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        notify.remember_server_loop()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        groups = await database_sync_to_async(self.allowed_groups)(user)
        if groups is None:
            await self.close(code=4404)
            return
        self.groups_to_join = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        # Publishers render only for groups somebody watches (dashboard.presence).
        await presence.mark(groups)
        self.presence_task = asyncio.create_task(presence.keep_marked(groups))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.presence_task is not None:
            self.presence_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.presence_task
        for group in getattr(self, "groups_to_join", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def html(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["html"])

    def allowed_groups(self, user: Any) -> list[str] | None:
        raise NotImplementedError


class ClusterConsumer(_Live):
    def allowed_groups(self, user: Any) -> list[str] | None:
        return ["cluster"]


class JobListConsumer(_Live):
    def allowed_groups(self, user: Any) -> list[str] | None:
        return ["jobs-staff"] if user.is_staff else [f"jobs-{user.pk}"]


class MyJobsConsumer(_Live):
    """The rows of the user's own jobs, staff included (static/berth/job-alerts.js turns
    their state changes into browser notifications)."""

    def allowed_groups(self, user: Any) -> list[str] | None:
        return [f"jobs-{user.pk}"]


class FlowListConsumer(_Live):
    def allowed_groups(self, user: Any) -> list[str] | None:
        return ["flows-staff"] if user.is_staff else [f"flows-{user.pk}"]


class JobConsumer(_Live):
    def allowed_groups(self, user: Any) -> list[str] | None:
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        if not Job.objects.visible_to(user).filter(pk=job_id).exists():
            return None
        return [f"job-{job_id}"]


class FlowConsumer(_Live):
    def allowed_groups(self, user: Any) -> list[str] | None:
        flow_id = self.scope["url_route"]["kwargs"]["flow_id"]
        if not Flow.objects.visible_to(user).filter(pk=flow_id).exists():
            return None
        return [f"flow-{flow_id}"]
