"""End to end: a job's web app reached through Berth's proxy (docs/interactive.md#web-apps).

The server runs as it does in production (uvicorn serving berth/asgi.py, where /apps/ is
routed); a real agent runs the job, picks the app's port and reports it; the requests go
through the proxy to that node and port, for the job's owner only."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from bench.processes import free_port
from scheduler.jobs.webapps import app_token
from scheduler.models import Job, Task
from scheduler.states.names import JobState, TaskState
from tests.e2e.conftest import ROOT, Cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

# The app of an `http` job: a plain web server, which knows nothing of /apps/<job>.
# It serves a folder of the task's /tmp (private to the task as root: its work dir's path,
# under pytest's /tmp, is hidden there).
HTTP_APP = (
    'site="${TMPDIR:-/tmp}/site" && mkdir -p "$site/sub" && '
    'echo hello-from-the-app > "$site/sub/hello.txt" && '
    'exec python3 -m http.server "$BERTH_APP_PORT" --bind "$BERTH_APP_HOST" --directory "$site"'
)
# A websocket echo server in the standard library only (the task's python3 is the
# system's): its first message says what it was sent (path, Authorization, Cookie).
ECHO_APP = r"""exec python3 - <<'EOF'
import asyncio, base64, hashlib, os, struct
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def frame(data):
    n = len(data)
    return (bytes([0x81, n]) if n < 126 else bytes([0x81, 126]) + struct.pack("!H", n)) + data
async def handle(reader, writer):
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    path = head[0].split(" ")[1]
    headers = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in head[1:] if ":" in line)}
    said = " | ".join([path, headers.get("authorization", "-"), headers.get("cookie", "-")])
    if headers.get("upgrade", "").lower() != "websocket":
        body = said.encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                     % len(body) + body)
        await writer.drain()
        writer.close()
        return
    key = headers["sec-websocket-key"].encode()
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    writer.write(frame(said.encode()))
    while True:
        b1, b2 = await reader.readexactly(2)
        n = b2 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await reader.readexactly(8))[0]
        mask = await reader.readexactly(4)
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await reader.readexactly(n)))
        if b1 & 0x0F == 8:
            writer.write(bytes([0x88, 0]))
            await writer.drain()
            break
        if b1 & 0x0F == 1:
            writer.write(frame(b"echo " + data))
            await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, os.environ["BERTH_APP_HOST"],
                                        int(os.environ["BERTH_APP_PORT"]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
EOF"""


@pytest.fixture
def served(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with its server as production runs it: uvicorn serving berth/asgi.py (the
    live server the other e2e tests use is Django's WSGI one, without /apps/). Same secret
    key as this process, so sessions made here are good there."""
    port = free_port()
    cluster.env["BERTH_SECRET_KEY"] = settings.SECRET_KEY
    log = open(cluster.tmp / "uvicorn.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "berth.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log"],
        cwd=ROOT, env=cluster.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    cluster.procs.append(proc)
    cluster.url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{cluster.url}/healthz"), timeout=60, what="uvicorn to serve")
    yield cluster


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 600
    except httpx.HTTPError:
        return False


def _submit(cluster: Cluster, token: str, app: str, command: str) -> int:
    spec = {"name": f"{app}-app", "apps": app, "walltime": 600,
            "tasks": [{"name": "main", "command": command,
                       "resources": {"cpu": "0.1", "memory": "64Mi"}}]}  # fmt: skip
    response = httpx.post(f"{cluster.url}/api/v1/jobs/", json=spec, headers=_auth(token))
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Token {token}"}


def _running_app(cluster: Cluster, job_id: int, token: str) -> httpx.Response:
    """Wait for the job to run and its app to answer through the proxy; its answer."""
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, timeout=60,
             what="the app's job to run")  # fmt: skip

    def answered() -> httpx.Response | None:
        response = httpx.get(f"{cluster.url}/apps/{job_id}/", headers=_auth(token), timeout=10)
        return response if response.status_code != 502 else None

    return wait_for(answered, timeout=60, what="the app to answer through the proxy")


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def test_an_http_app_answers_its_owner_only_without_the_prefix(
    served: Cluster, token: str, owner: Any, outsider: Any, staff: Any
) -> None:
    served.agent("e2e-app")
    served.scheduler()
    job_id = _submit(served, token, "http", HTTP_APP)
    listing = _running_app(served, job_id, token)
    # http.server lists "/": it was sent the path without /apps/<job>.
    assert listing.status_code == 200 and "Directory listing for /" in listing.text

    url = f"{served.url}/apps/{job_id}"
    by_token = httpx.get(f"{url}/sub/hello.txt", headers=_auth(token))
    assert (by_token.status_code, by_token.text) == (200, "hello-from-the-app\n")
    cookie = {settings.SESSION_COOKIE_NAME: _session_cookie(owner)}
    by_session = httpx.get(f"{url}/sub/hello.txt", cookies=cookie)
    assert (by_session.status_code, by_session.text) == (200, "hello-from-the-app\n")
    # The app's redirect to one of its own paths comes back under the prefix.
    moved = httpx.get(f"{url}/sub", headers=_auth(token))
    assert moved.status_code == 301 and moved.headers["location"] == f"/apps/{job_id}/sub/"
    assert httpx.get(url, headers=_auth(token)).headers["location"] == f"/apps/{job_id}/"

    # Anyone else: 404, exactly as for a job that does not exist; no sign-in: to the login.
    for user in (outsider, staff):
        theirs = {settings.SESSION_COOKIE_NAME: _session_cookie(user)}
        other = httpx.get(f"{url}/sub/hello.txt", cookies=theirs)
        missing = httpx.get(f"{served.url}/apps/{job_id + 1000}/", cookies=theirs)
        assert other.status_code == missing.status_code == 404
        assert "hello-from-the-app" not in other.text
    anonymous = httpx.get(f"{url}/sub/hello.txt")
    assert anonymous.status_code == 302
    assert anonymous.headers["location"].startswith(settings.LOGIN_URL)
    assert httpx.get(f"{url}/", headers=_auth("not-a-token")).status_code == 401

    # A cross-site form post riding the session is refused; the owner's own origin is not.
    posted = httpx.post(f"{url}/sub/hello.txt", cookies=cookie,
                        headers={"Origin": "https://evil.example"})  # fmt: skip
    assert posted.status_code == 403
    same = httpx.post(f"{url}/sub/hello.txt", cookies=cookie,
                      headers={"Origin": served.url})  # fmt: skip
    assert same.status_code == 501  # http.server's answer to POST: it reached the app


def test_a_jupyter_app_keeps_the_prefix_and_its_websockets_are_relayed(
    served: Cluster, token: str, owner: Any, outsider: Any
) -> None:
    served.agent("e2e-app")
    served.scheduler()
    job_id = _submit(served, token, "jupyter", ECHO_APP)
    task = Task.objects.get(job_id=job_id)
    plain = _running_app(served, job_id, token)
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING and task.app_port
    secret = app_token(task.pk, task.attempt)
    # The app sees the prefix, Berth's secret for it, and none of the user's credentials.
    assert plain.text == f"/apps/{job_id}/ | token {secret} | -"

    cookie = f"{settings.SESSION_COOKIE_NAME}={_session_cookie(owner)}; theirs=kept"
    ws_url = served.url.replace("http://", "ws://") + f"/apps/{job_id}/api/kernels/ws?x=1"
    with ws_connect(ws_url, additional_headers={"Cookie": cookie, "Origin": served.url}) as ws:
        said = ws.recv(timeout=10)
        assert said == f"/apps/{job_id}/api/kernels/ws?x=1 | token {secret} | theirs=kept"
        ws.send("ping-1")
        assert ws.recv(timeout=10) == "echo ping-1"
    with ws_connect(ws_url, additional_headers=_auth(token)) as ws:
        ws.recv(timeout=10)
        ws.send("by token")
        assert ws.recv(timeout=10) == "echo by token"

    # Another user's session, another site's page riding the owner's session: refused.
    for headers in (
        {"Cookie": f"{settings.SESSION_COOKIE_NAME}={_session_cookie(outsider)}",
         "Origin": served.url},
        {"Cookie": cookie, "Origin": "https://evil.example"},
    ):  # fmt: skip
        with pytest.raises(InvalidStatus):
            ws_connect(ws_url, additional_headers=headers).close()


class Canary:
    """A listener that counts connections: where a request must never go."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_hostile_request_targets_reach_only_the_apps_node_and_port(
    served: Cluster, token: str
) -> None:
    served.agent("e2e-app")
    served.scheduler()
    job_id = _submit(served, token, "http", HTTP_APP)
    _running_app(served, job_id, token)
    canary = Canary()
    port = int(served.url.rsplit(":", 1)[1])
    here, there = f"127.0.0.1:{port}", f"127.0.0.1:{canary.port}"
    auth = f"Authorization: Token {token}\r\nConnection: close\r\n\r\n"
    targets = [
        f"/apps/{job_id}/../../api/v1/jobs/",
        f"/apps/{job_id}/%2e%2e/%2e%2e/api/v1/jobs/",
        f"/apps/{job_id}//{there}/",
        f"/apps/{job_id}/@{there}/",
        f"/apps/{job_id}%2F..%2F..%2Fhealthz",
        f"http://{there}/apps/{job_id}/",
        f"http://{here}/apps/{job_id}/sub/hello.txt",
        f"/apps/{job_id}/\\\\{there}/",
    ]
    for target in targets:
        answer = _raw(port, f"GET {target} HTTP/1.1\r\nHost: {here}\r\n{auth}".encode())
        status = int(answer.split(b" ", 2)[1])
        # Either the app answered (http.server names itself) or Berth refused it: never a
        # Berth page or API reached through the back door, never another host.
        assert status in (400, 404) or b"SimpleHTTP" in answer, (target, answer[:300])
        assert b'"results"' not in answer and b'"detail"' not in answer, target
    # A Host naming another port of an allowed host still reaches the app (the Host header
    # picks nothing); a Host Berth does not serve is refused, as Django refuses it.
    answer = _raw(port, f"GET /apps/{job_id}/ HTTP/1.1\r\nHost: {there}\r\n{auth}".encode())
    assert b"SimpleHTTP" in answer, answer[:300]
    for host in ("evil.example", f"{here}@{there}", f"evil.example:{canary.port}"):
        answer = _raw(port, f"GET /apps/{job_id}/ HTTP/1.1\r\nHost: {host}\r\n{auth}".encode())
        assert answer.startswith(b"HTTP/1.1 400"), (host, answer[:200])
    # Smuggling: both Content-Length and Transfer-Encoding is refused by the HTTP parser.
    smuggled = (f"POST /apps/{job_id}/ HTTP/1.1\r\nHost: {here}\r\nContent-Length: 4\r\n"
                f"Transfer-Encoding: chunked\r\n{auth}0\r\n\r\n").encode()  # fmt: skip
    assert _raw(port, smuggled).startswith(b"HTTP/1.1 400")
    assert canary.hits == 0
    canary.sock.close()
