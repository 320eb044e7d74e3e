"""The user's end of a terminal session: `/ws/jobs/<job>/shell/` (docs/interactive.md).

Signed in by the session cookie (the browser; the socket's Origin is checked by
AllowedHostsOriginValidator, so another site cannot open one with the user's cookie) or by
`Authorization: Token <key>` (the CLI). Only the job's owner, or staff where the job's queue
allows it; anyone else is refused as if the job did not exist. The first frame is
`{"type": "open", "command", "rows", "cols", "term"}`; then binary frames are keystrokes and
`{"type": "resize", "rows", "cols"}` a new size. The server answers `{"type": "ready"}` once
the node's agent joined, then binary output, `{"type": "notice", "message"}` for a line from
Berth (an idle GPU session's warning), and ends with `{"type": "exit", "status"}` or
`{"type": "error", "message"}`. The relay to the agent's socket is in
scheduler/agentapi/terminal.py. The end also reaches the user when its message through the
channel layer does not: every WATCH_SECONDS the socket reads its session's row, and a session
the other end closed there ends this socket too, with the row's exit status or reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull

from scheduler import notify
from scheduler.agent.wire import TERMINAL_FRAME_BYTES, terminal_size
from scheduler.agentapi.terminal import (
    NOT_FOUND,
    RELAY_FAILED,
    TOO_BIG,
    UNAUTHORIZED,
    EndsTogether,
    attempt,
    group_name,
    header,
)
from scheduler.api.authentication import MAX_KEY_LENGTH
from scheduler.jobs import terminals
from scheduler.ops.tokens import KeyRefused, user_for_key

log = logging.getLogger("berth.dashboard")
OPEN_SECONDS = 10.0  # the client's `open` must come this soon after connecting
READY_SECONDS = terminals.UNANSWERED_SECONDS + 5  # the agent must join this soon after
MAX_PENDING_BYTES = 64 * 1024  # typed before the agent joined, held until it does
WATCH_SECONDS = 5.0  # how often an open socket reads its session's row (a lost end message)
REFUSED = 4409


def token_user(scope: dict[str, Any]) -> Any:
    """The user an `Authorization: Token <key>` header signs in as, or None."""
    scheme, _, key = header(scope, "authorization").partition(" ")
    key = key.strip()
    if scheme.lower() not in ("token", "bearer") or not key or len(key) > MAX_KEY_LENGTH:
        return None
    try:
        found = user_for_key(key)
    except KeyRefused:
        return None
    return found[0] if found else None


class ShellConsumer(EndsTogether):
    channel_layer_alias = "shell"  # a layer of its own: berth/settings.py says why
    key = ""
    peer = ""  # the agent's socket's channel, once it joined
    accepted = False
    ended = False
    timer: asyncio.Task[None] | None = None
    watch: asyncio.Task[None] | None = None

    async def failed(self) -> None:
        await self._end_session("the session failed on the server", RELAY_FAILED)

    async def _end_session(self, why: str, code: int) -> None:
        """End the session from this end, as `Failed`: the row first (nobody else would close
        it), then the agent's end, then the user, each tried whatever the one before did (a
        user whose client went away cannot be told, and the rest must still happen)."""
        if not self.ended:
            self._stop_timers()
            self.ended = True
            if self.key:
                close = database_sync_to_async(terminals.close_session)
                await attempt("close its row", self.key, close(self.key, "Failed", why))
                hangup = {"type": "shell.hangup", "reason": "Failed"}
                await attempt("hang up the agent's end", self.key, self._to_agent(hangup))
            if self.accepted:
                said = json.dumps({"type": "error", "message": why})
                await attempt("tell the user", self.key, self.send(text_data=said))
        await self.close_quietly(code)

    def _stop_timers(self) -> None:
        """The session ended: its open/ready deadline and its row watch have nothing left to
        do (unless one of them is what ends it: it is past its last await on the timer)."""
        for task in (self.timer, self.watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    async def connect(self) -> None:
        notify.remember_server_loop()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            user = await database_sync_to_async(token_user)(self.scope)
        if user is None:
            await self.close(code=UNAUTHORIZED)
            return
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        self.job = await database_sync_to_async(terminals.shell_job)(job_id, user)
        if self.job is None:
            await self.close(code=NOT_FOUND)
            return
        self.user = user
        self.pending: list[bytes] = []
        await self.accept()
        self.accepted = True
        self.timer = asyncio.create_task(self._deadline(OPEN_SECONDS, "no open message"))

    async def _deadline(self, seconds: float, why: str) -> None:
        await asyncio.sleep(seconds)
        await self._fail(why)

    async def _fail(self, message: str, code: int = 1000) -> None:
        if not self.ended:  # (else ended already: by the agent's end, the row, or a failure)
            await self._end_session(message, code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.ended:
            return
        if bytes_data is not None:
            if len(bytes_data) > TERMINAL_FRAME_BYTES:
                await self._fail(f"frames of at most {TERMINAL_FRAME_BYTES} bytes", TOO_BIG)
            elif not self.key:
                await self._fail("the first frame must be the open message")
            else:
                await self._input(bytes_data)
            return
        try:
            message = json.loads(text_data or "")
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await self._fail("text frames must be JSON objects")
        elif message.get("type") == "open" and not self.key:
            await self._open(message)
        elif message.get("type") == "resize" and self.key:
            rows = terminal_size(message.get("rows"), 24)
            cols = terminal_size(message.get("cols"), 80)
            await self._to_agent({"type": "shell.resize", "rows": rows, "cols": cols})

    async def _open(self, message: dict[str, Any]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        command = message.get("command") or ""
        if not isinstance(command, str):
            await self._fail("command: must be text")
            return
        try:
            session = await database_sync_to_async(terminals.request_session)(
                self.job, self.user, self.channel_name, command, message.get("rows"),
                message.get("cols"), message.get("term"),
            )  # fmt: skip
        except terminals.ShellRefused as exc:
            await self._fail(str(exc), REFUSED)
            return
        self.key = session.key
        await self.channel_layer.group_add(group_name(self.key), self.channel_name)
        self.timer = asyncio.create_task(
            self._deadline(READY_SECONDS, "the node's agent did not open the session")
        )
        self.watch = asyncio.create_task(self._watch_row())

    async def _watch_row(self) -> None:
        """End this socket once the session's row says the session ended: the other end's
        message saying so goes through the channel layer, and a lost one must not leave the
        user's terminal open on nothing."""
        while not self.ended:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                end = await database_sync_to_async(terminals.session_end)(self.key)
            except Exception as exc:  # noqa: BLE001 - read again next time
                log.warning("terminal session %s: could not read its row: %s", self.key[:8], exc)
                continue
            if end is None or self.ended:
                continue
            await asyncio.sleep(1.0)  # the message itself, on its way, says it better
            if self.ended:
                return
            reason, status = end
            why = f"the session ended ({reason})"
            told = (self.shell_exit({"status": status}) if reason == "Exited"
                    else self.shell_error({"message": why}))  # fmt: skip
            await attempt("end the user's socket", self.key, told)

    async def _input(self, data: bytes) -> None:
        if not self.peer:
            if sum(map(len, self.pending)) + len(data) > MAX_PENDING_BYTES:
                await self._fail("too much input before the session opened", TOO_BIG)
                return
            self.pending.append(data)
            return
        await self._to_agent({"type": "shell.input", "data": data})

    async def _to_agent(self, event: dict[str, Any]) -> None:
        if not self.peer:
            return
        try:
            await self.channel_layer.send(self.peer, event)
        except ChannelFull:
            await self._fail("input flood: the node cannot keep up, session ended", TOO_BIG)

    # --- from the agent's socket (scheduler/agentapi/terminal.py) ---------------------------

    async def shell_hello(self, event: dict[str, Any]) -> None:
        if event.get("role") != "agent" or self.peer or self.ended:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.peer = str(event["channel"])
        await self.send(text_data=json.dumps({"type": "ready", "session": self.key[:8]}))
        pending, self.pending = self.pending, []
        for data in pending:
            await self._to_agent({"type": "shell.input", "data": data})

    async def shell_output(self, event: dict[str, Any]) -> None:
        if self.ended:  # (output still on its way after the end: the socket is closed)
            return
        await self.send(bytes_data=event["data"])
        await self._to_agent({"type": "shell.ack", "n": 1})

    async def shell_notice(self, event: dict[str, Any]) -> None:
        """A line from Berth for this terminal's user (an idle warning, scheduler/notify.py)."""
        if not self.ended:
            await self.send(text_data=json.dumps({"type": "notice", "message": event["message"]}))

    async def shell_exit(self, event: dict[str, Any]) -> None:
        if self.ended:  # (told already, by the session's row or an earlier message)
            return
        self._stop_timers()
        self.ended = True
        await self.send(text_data=json.dumps({"type": "exit", "status": event.get("status")}))
        await self.close()

    async def shell_error(self, event: dict[str, Any]) -> None:
        if self.ended:
            return
        self._stop_timers()
        self.ended = True
        await self.send(text_data=json.dumps({"type": "error", "message": event["message"]}))
        await self.close()

    async def disconnect(self, code: int) -> None:
        for task in (self.timer, self.watch):
            if task is not None:
                task.cancel()
        if not self.key:
            return
        await self.channel_layer.group_discard(group_name(self.key), self.channel_name)
        if not self.ended:
            self.ended = True
            await self._to_agent({"type": "shell.hangup", "reason": "Disconnected"})
            await database_sync_to_async(terminals.close_session)(
                self.key, "Disconnected", "the user's socket closed"
            )
