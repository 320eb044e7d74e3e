"""Back-pressure: the agent and the simulated agent, against a tiny scripted HTTP server that
answers 429/503 with Retry-After, wait as asked and lose no report and no output."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.client import (
    PROTOCOL,
    Backoff,
    Http,
    ServerError,
    Unavailable,
    parse_retry_after,
)
from scheduler.agent.runtime import Agent
from scheduler.agent.sim import SimCluster
from tests.agent.test_runtime import agent_running

RETRY_AFTER = 1  # seconds the fake server asks for


@dataclass
class Seen:
    time: float
    path: str
    status: int
    body: dict[str, Any]


@dataclass
class FakeServer:
    """Answers each path from a script: `refuse[path]` is a list of statuses to give first
    (429/503 with Retry-After); then register/report/log succeed, and `lease/` hands out
    `orders` once, then holds briefly with nothing."""

    url: str = ""
    refuse: dict[str, list[int]] = field(default_factory=dict)
    orders: list[dict[str, Any]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    inline: int = 0  # inline_output_bytes announced at registration (0: none)
    heartbeat_timeout: float = 0.0  # announced at registration when set (agent/partition.py)

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        key = path.removeprefix("/api/v1/agent/")
        key = "log/" if key.startswith("tasks/") else key
        with self.lock:
            script = self.refuse.get(key, [])
            status = script.pop(0) if script else 200
            self.seen.append(Seen(time.monotonic(), key, status, body))
            if status != 200:
                return status, {"detail": "busy"}
            if key == "lease/" and self.orders:
                return 200, self.orders.pop(0)
        if key == "register/":
            return 201, {"token": f"token-{body['name']}", "lease_seconds": 0.2,
                         "kill_grace_seconds": 1, "log_chunk_bytes": 65536,
                         "inline_output_bytes": self.inline,
                         "heartbeat_timeout": self.heartbeat_timeout}  # fmt: skip
        if key == "lease/":
            time.sleep(0.1)
            return 200, {"start": [], "kill": [], "lease_seconds": 0.2}
        if key == "log/":
            return 200, {"next_offset": body["offset"] + len(body["data"].encode())}
        return 200, {"start": [], "kill": [], "awaiting_output": []}

    def where(self, path: str, status: int | None = None) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path == path and status in (None, s.status)]


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the http.server name
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            assert self.headers["Berth-Agent-Protocol"] == str(PROTOCOL)
            status, answer = fake.answer(self.path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            if status in (429, 503):
                self.send_header("Retry-After", str(RETRY_AFTER))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def final_reports(server: FakeServer, task_id: int) -> list[dict[str, Any]]:
    return [t for s in server.where("report/", 200) for t in s.body["tasks"]
            if t["id"] == task_id and t["state"] != "Running"]  # fmt: skip


def assert_waited_as_asked(server: FakeServer, path: str) -> None:
    """Every request after a refusal came at least Retry-After later."""
    calls = server.where(path)
    for refused, following in zip(calls, calls[1:], strict=False):
        if refused.status != 200:
            assert following.time - refused.time >= RETRY_AFTER


def start(task_id: int, command: str) -> dict[str, Any]:
    return {"start": [{"id": task_id, "attempt": 0, "command": command, "env": {}}], "kill": []}


def test_the_agent_backs_off_as_asked_and_loses_no_report_or_output(server, tmp_path: Path):
    server.orders = [start(1, "echo out; echo more")]
    # After the first (empty) report, three in a row are refused; so is the first chunk.
    server.refuse = {"register/": [503], "report/": [200, 503, 429, 503], "log/": [429]}
    agent = Agent(server.url, "join", name="node-a", work_dir=tmp_path)
    with agent_running(agent):
        (final,) = wait_for(lambda: final_reports(server, 1))
    assert (final["state"], final["exit_code"], final["output_bytes"]) == ("Succeeded", 0, 9)
    chunks = [s.body for s in server.where("log/", 200)]
    assert "".join(c["data"] for c in chunks) == "out\nmore\n"
    assert [c["offset"] for c in chunks] == [0]  # the refused chunk sent again, not skipped
    assert len(server.where("report/", 503)) + len(server.where("report/", 429)) == 3
    for path in ("register/", "report/", "log/"):
        assert_waited_as_asked(server, path)


def test_the_simulated_agent_backs_off_as_asked_and_loses_no_report(server):
    server.orders = [start(7, "sleep 1")]
    server.refuse = {"report/": [200, 503, 503, 429], "log/": [503]}
    cluster = SimCluster(server.url, "join", nodes=1, gpus=0, cpu=1000, memory=2**30)
    stop = threading.Event()
    thread = threading.Thread(target=cluster.run, args=(stop,))
    thread.start()
    try:
        (final,) = wait_for(lambda: final_reports(server, 7))
    finally:
        stop.set()
        thread.join(10)
    assert (final["state"], final["exit_code"]) == ("Succeeded", 0)
    (chunk,) = [s.body for s in server.where("log/", 200)]
    assert final["output_bytes"] == len(chunk["data"].encode()) > 0
    for path in ("report/", "log/"):
        assert_waited_as_asked(server, path)


# --- the client's parts ------------------------------------------------------------------


def test_it_reads_retry_after_as_seconds_or_a_date_and_bounds_it():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("99999999") == 300.0  # a server cannot park an agent for ever
    assert parse_retry_after("-5") == 0.0
    for bad in (None, "", "soon", "nan"):
        assert parse_retry_after(bad) is None


def test_its_backoff_grows_with_jitter_up_to_a_cap_and_honours_retry_after():
    low = Backoff(base=0.5, cap=4.0, rand=lambda: 0.0)
    high = Backoff(base=0.5, cap=4.0, rand=lambda: 1.0)
    assert [low.delay() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert [high.delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert Backoff(rand=lambda: 0.0).delay(retry_after=7) == 7.0
    assert Backoff(rand=lambda: 1.0).delay(retry_after=7) == pytest.approx(8.4)  # +20% at most
    high.reset()
    assert high.delay() == 0.5


def test_it_tells_come_back_later_from_refused(server):
    http = Http(server.url)
    server.refuse = {"report/": [503, 429, 400]}
    for status in (503, 429):
        with pytest.raises(Unavailable) as unavailable:
            http.post("report/", {})
        assert (unavailable.value.status, unavailable.value.retry_after) == (status, RETRY_AFTER)
    with pytest.raises(ServerError) as refused:
        http.post("report/", {})
    assert refused.value.status == 400
    assert http.post("report/", {}) == {"start": [], "kill": [], "awaiting_output": []}
    with pytest.raises(Unavailable):  # nobody listens there
        Http("http://127.0.0.1:9").post("report/", {})


def test_a_shut_down_client_sends_nothing_more(server):
    http = Http(server.url)
    assert http.post("report/", {})["kill"] == []
    http.abort()
    with pytest.raises(Unavailable):
        http.post("report/", {})
    assert len(server.where("report/")) == 1
