"""A local webhook receiver and a local SMTP server (aiosmtpd) for the notifier's tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller


@dataclass
class Receiver:
    """Records every request; answers with `statuses` in turn (then 200), after `delay`."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    delay: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(state.delay)
            with state.lock:
                state.requests.append({"headers": dict(self.headers), "body": body,
                                       "path": self.path})  # fmt: skip
                code = state.statuses.pop(0) if state.statuses else 200
            self.send_response(code)
            if 300 <= code < 400:
                self.send_header("Location", f"{state.url}elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        # The default policy unfolds headers as a mail reader does: a long Subject is folded
        # on the wire (CRLF and a space), which is not a newline in the subject itself.
        parsed = message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append((envelope.rcpt_tos, parsed))
        return "250 OK"


@pytest.fixture
def smtp(settings: Any) -> Iterator[Inbox]:
    """A real SMTP server on a free local port; Django's SMTP backend sends to it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    yield inbox
    controller.stop()
