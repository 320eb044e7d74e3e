"""The agent's end of a terminal session: `/ws/agent/sessions/<key>/` (docs/agents.md).

The agent opens this socket itself (outbound: nodes listen on no port), signed in with its
node token as on its HTTP requests, for a session the server ordered in its lease's answer
and only for its own node's. Frames go to and from the user's socket (dashboard/shell.py)
through the channel layer, so the two may be served by different web processes: both join
the group `shell-<key>`; the user's socket's channel is on the session's row, and this end
says hello to the group with its own; then each sends to the other's channel directly (a full
channel is a peer too slow, and ends the session, rather than frames silently lost). This end
also ends a session with no input for the queue's `interactive_idle_minutes`, and keeps the
time of the session's latest input on its row (`last_input_at`, at most every
INPUT_MARK_SECONDS) for the scheduler's idle GPU sessions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull, StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from scheduler import notify
from scheduler.agent.wire import PROTOCOL, PROTOCOL_HEADER, TERMINAL_FRAME_BYTES
from scheduler.agentapi.common import node_for_token
from scheduler.jobs import terminals

log = logging.getLogger("berth.agentapi")
UNAUTHORIZED, NOT_FOUND, TOO_BIG = 4401, 4404, 4413
RELAY_FAILED = 1011  # an unexpected error on the server (the websocket code for it)
INPUT_MARK_SECONDS = 30.0  # the idle GPU session limits count in minutes


def header(scope: dict[str, Any], name: str) -> str:
    wanted = name.lower().encode()
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return bytes(value).decode(errors="replace")
    return ""


def group_name(key: str) -> str:
    return f"shell-{key}"


class EndsTogether(AsyncWebsocketConsumer):
    """One end of a terminal session (this module's, the agent's; dashboard/shell.py, the
    user's). An unexpected error while handling a frame, a message or a timer (the database
    refusing a write under load, a bug) ends the session for both ends through `failed()`,
    saying so, instead of ending this consumer alone and leaving the other end, and the
    user's terminal, waiting for an end nobody sends."""

    key = ""

    async def dispatch(self, message: dict[str, Any]) -> None:
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            log.exception("terminal session %s: %s failed", self.key[:8] or "?",
                          type(self).__name__)  # fmt: skip
            await self.failed()
            if message.get("type") == "websocket.disconnect":
                raise StopConsumer() from None  # (what the disconnect would have raised)

    async def failed(self) -> None:
        raise NotImplementedError

    async def close_quietly(self, code: int) -> None:
        """Close the socket; one closed already (or whose client went) is left as it is."""
        try:
            await self.close(code=code)
        except Exception:  # noqa: BLE001 - a server may refuse a second close
            pass


async def attempt(what: str, key: str, step: Any) -> None:
    """One step of ending a session after a failure: awaited, and logged if it fails too, so
    that the steps after it are still taken."""
    try:
        await step
    except Exception:  # noqa: BLE001 - logged; the next step may still work
        log.exception("terminal session %s: could not %s", key[:8] or "?", what)


class AgentTerminalConsumer(EndsTogether):
    channel_layer_alias = "shell"  # a layer of its own: berth/settings.py says why
    key = ""
    peer = ""  # the user's socket's channel
    claimed = False  # this node proved the session its own (before: its key is only its URL's)
    closed = False  # the session's row is closed
    idle_task: asyncio.Task[None] | None = None
    input_marked = -math.inf  # when the row last got this session's input time

    async def failed(self) -> None:
        """The row first (the user's end reads it), then the user; nothing for a socket that
        never proved the session its own (its key is only what its URL said)."""
        if self.claimed and not self.closed:
            self.closed = True
            why = "the session's relay failed on the server"
            close = database_sync_to_async(terminals.close_session)
            await attempt("close its row", self.key, close(self.key, "Failed", why))
            await attempt("tell the user", self.key,
                          self._to_user({"type": "shell.error", "message": why}))  # fmt: skip
        await self.close_quietly(RELAY_FAILED)

    async def connect(self) -> None:
        notify.remember_server_loop()
        self.key = str(self.scope["url_route"]["kwargs"]["session"])[:64]
        scheme, _, token = header(self.scope, "authorization").partition(" ")
        if header(self.scope, PROTOCOL_HEADER).strip() != str(PROTOCOL) or scheme != "Node":
            await self.close(code=UNAUTHORIZED)
            return
        node = await database_sync_to_async(node_for_token)(token.strip())
        if node is None:
            await self.close(code=UNAUTHORIZED)
            return
        session = await database_sync_to_async(terminals.claim)(self.key, node)
        if session is None:  # not this node's, or not waiting to be opened
            self.key = ""
            await self.close(code=NOT_FOUND)
            return
        self.claimed, self.peer = True, session.client_channel
        self.last_input = time.monotonic()
        idle = await database_sync_to_async(terminals.idle_minutes)(session)
        await self.channel_layer.group_add(group_name(self.key), self.channel_name)
        await self.accept()
        await self.channel_layer.group_send(
            group_name(self.key),
            {"type": "shell.hello", "role": "agent", "channel": self.channel_name},
        )
        if idle > 0:
            self.idle_task = asyncio.create_task(self._watch_idle(idle * 60))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None:
            if len(bytes_data) > TERMINAL_FRAME_BYTES:
                await self._end("Failed", "the agent sent an oversized frame", code=TOO_BIG)
                return
            await self._to_user({"type": "shell.output", "data": bytes_data})
            return
        try:
            message = json.loads(text_data or "")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "exit":
            status = message.get("status")
            status = status if isinstance(status, int) and 0 <= status < 512 else None
            await self._to_user({"type": "shell.exit", "status": status})
            await self._end("Exited", exit_status=status)
        elif message.get("type") == "error":
            text = str(message.get("message", ""))[:500]
            await self._to_user({"type": "shell.error", "message": text})
            await self._end("Failed", text)

    async def _to_user(self, event: dict[str, Any]) -> None:
        if not self.peer:
            return
        try:
            await self.channel_layer.send(self.peer, event)
        except ChannelFull:
            await self._end("Failed", "the user's socket is too slow")

    async def _end(self, reason: str, message: str = "", exit_status: int | None = None,
                   code: int = 1000) -> None:  # fmt: skip
        if not self.closed:
            self.closed = True
            await database_sync_to_async(terminals.close_session)(
                self.key, reason, message, exit_status
            )
        await self.close(code=code)

    async def _watch_idle(self, limit: float) -> None:
        while True:
            left = limit - (time.monotonic() - self.last_input)
            if left <= 0:
                why = f"no input for {limit / 60:g} minutes"
                await self._to_user({"type": "shell.error", "message": f"{why}: ended"})
                await self.send(text_data=json.dumps({"type": "hangup", "reason": "Idle"}))
                await self._end("Idle", why)
                return
            await asyncio.sleep(min(left, 30.0))

    # --- from the user's socket (dashboard/shell.py) ---------------------------------------

    async def shell_hello(self, event: dict[str, Any]) -> None:
        pass  # its own, sent to the group for the user's socket

    async def shell_input(self, event: dict[str, Any]) -> None:
        await self.send(bytes_data=event["data"])
        await self._typed()

    async def shell_resize(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"type": "resize", "rows": event["rows"],
                                              "cols": event["cols"]}))  # fmt: skip
        await self._typed()

    async def _typed(self) -> None:
        """Input: the idle clock starts again; the session's row says so at most every
        INPUT_MARK_SECONDS (the first input at once), after the bytes went on, for the
        scheduler's idle GPU sessions (scheduler/lifecycle/idle_sessions.py)."""
        self.last_input = time.monotonic()
        if self.last_input - self.input_marked >= INPUT_MARK_SECONDS:
            self.input_marked = self.last_input
            try:
                await database_sync_to_async(terminals.mark_input)(self.key)
            except Exception:  # noqa: BLE001 - bookkeeping: the session goes on (next try in
                # INPUT_MARK_SECONDS: a database in trouble is not asked at every keystroke)
                log.warning("terminal session %s: could not mark its input time", self.key[:8],
                            exc_info=True)  # fmt: skip

    async def shell_ack(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"type": "ack", "n": event.get("n", 1)}))

    async def shell_hangup(self, event: dict[str, Any]) -> None:
        self.closed = True  # the user's side closed the row
        await self.send(text_data=json.dumps({"type": "hangup", "reason": event.get("reason")}))
        await self.close()

    async def disconnect(self, code: int) -> None:
        if self.idle_task is not None:
            self.idle_task.cancel()
        if not self.claimed:  # never proved the session its node's: its key is only its URL's
            return
        await self.channel_layer.group_discard(group_name(self.key), self.channel_name)
        if not self.closed:
            self.closed = True
            await self._to_user({"type": "shell.error", "message": "the node's connection closed"})
            await database_sync_to_async(terminals.close_session)(
                self.key, "AgentGone", "the agent's socket closed"
            )
