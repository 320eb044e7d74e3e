"""The CLI's end of a terminal session (`berth shell`, `berth attach`; docs/interactive.md):
the local terminal in raw mode attached to `/ws/jobs/<job>/shell/` over a websocket signed in
with the user's API token. Keystrokes go as they are (Ctrl-C reaches the remote program),
a window resize (SIGWINCH) is sent as the new size, output is written as it comes, and the
remote command's exit status is returned. No Django: the `websockets` library's sync client.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from typing import Any

from berth.cli.client import CliError, Settings

FRAME_BYTES = 16 * 1024  # the server's bound per frame (scheduler/agent/wire.py)
# Close codes of the server's socket (dashboard/shell.py) and what they mean to a user.
CLOSE_REASONS = {4401: "the server did not accept your token",
                 4404: "no such job of yours", 4409: "refused", 4413: "too much input"}  # fmt: skip


def shell_url(base: str, job_id: int) -> str:
    scheme, _, rest = base.rstrip("/").partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws/jobs/{job_id}/shell/"


def terminal_size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """The local terminal in raw mode (no echo, no line editing, Ctrl-C as a byte), restored
    however the session ends; nothing changes when `fd` is not a terminal."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


class Attached:
    """One session's socket, with the local terminal's input and resizes sent on a thread
    of their own; `run()` writes the output and returns the exit status."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.wake_r, self.wake_w = os.pipe()  # SIGWINCH -> the input thread
        self.stop = threading.Event()

    def run(self) -> int:
        previous = signal.signal(signal.SIGWINCH, lambda *_: os.write(self.wake_w, b"w"))
        sender = threading.Thread(target=self._send_input, daemon=True)
        try:
            with raw_terminal(sys.stdin.fileno()):
                sender.start()
                return self._receive()
        finally:
            self.stop.set()
            signal.signal(signal.SIGWINCH, previous)
            os.write(self.wake_w, b"x")
            sender.join(timeout=1)
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _receive(self) -> int:
        from websockets.exceptions import ConnectionClosed

        out = sys.stdout.fileno()
        try:
            for frame in self.ws:
                if isinstance(frame, bytes):
                    _write_all(out, frame)
                    continue
                message = _json(frame)
                if message.get("type") == "exit":
                    status = message.get("status")
                    return status if isinstance(status, int) else 1
                if message.get("type") == "error":
                    raise CliError(f"session ended: {message.get('message')}")
                if message.get("type") == "notice":  # a line from Berth, on stderr
                    _write_all(sys.stderr.fileno(), f"\r\n[{message.get('message')}]\r\n".encode())
        except ConnectionClosed as exc:
            raise CliError(f"session ended: {_closed(exc)}") from None
        raise CliError("session ended: the server closed the connection")

    def _send_input(self) -> None:
        stdin = sys.stdin.fileno()
        sources = [stdin, self.wake_r]
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select(sources, [], [])
                if self.wake_r in ready:
                    os.read(self.wake_r, 64)
                    rows, cols = terminal_size()
                    self.ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))
                if stdin in ready:
                    data = os.read(stdin, FRAME_BYTES)
                    if not data:
                        sources.remove(stdin)  # end of input: the remote program goes on
                        continue
                    self.ws.send(data)
        except Exception:  # noqa: BLE001 - the socket closed: the main thread reports it
            return


def attach(settings: Settings, job_id: int, command: str = "") -> int:
    """Open a session in job `job_id` (running `command`, or a shell) on this terminal; the
    remote command's exit status (CliError when the server refuses or ends the session)."""
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect
    from websockets.typing import Origin

    rows, cols = terminal_size()
    opening = {"type": "open", "command": command, "rows": rows, "cols": cols,
               "term": os.environ.get("TERM") or "xterm-256color"}  # fmt: skip
    try:
        ws = connect(shell_url(settings.url, job_id), origin=Origin(settings.url),
                     additional_headers={"Authorization": f"Token {settings.token}"},
                     proxy=None, compression=None, open_timeout=30,
                     max_size=4 * FRAME_BYTES)  # fmt: skip
    except InvalidStatus as exc:
        raise CliError(f"the server refused the session: HTTP {exc.response.status_code}") from None
    except (OSError, WebSocketException) as exc:
        raise CliError(f"cannot reach {settings.url}: {exc}") from None
    with ws:
        ws.send(json.dumps(opening))
        _wait_ready(ws)
        return Attached(ws).run()


def _wait_ready(ws: Any) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        while True:
            message = _json(ws.recv())
            if message.get("type") == "ready":
                return
            if message.get("type") == "error":
                raise CliError(str(message.get("message")))
    except ConnectionClosed as exc:
        raise CliError(_closed(exc)) from None


def _json(frame: object) -> dict[str, Any]:
    try:
        message = json.loads(frame) if isinstance(frame, str) else None
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _closed(exc: Any) -> str:
    code = exc.rcvd.code if exc.rcvd is not None else 0
    return CLOSE_REASONS.get(code, f"the connection closed (code {code})")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
