"""`./run up` runs the notifier in its own process: a job's end reaches a local webhook
receiver, signed, with no `run_notifier` started (SQLite, embedded defaults)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.processes import free_port, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]


def call(url: str, body: Any = None, token: str = "", method: str = "GET") -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_up_delivers_a_webhook_for_a_jobs_end(tmp_path: Path, receiver: Any) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "BERTH_SECRET_KEY", "BERTH_TEST_DB_NAME",
                        "DJANGO_SETTINGS_MODULE")}  # fmt: skip
    env.update({"BERTH_DATA_DIR": str(tmp_path / "data"), "BERTH_SCHEDULER_INTERVAL": "0.3",
                "BERTH_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1:*",
                "BERTH_NOTIFY_INTERVAL": "0.2"})  # fmt: skip
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port), "--no-agent"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api/v1"
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", proc, tmp_path / "up.log", timeout=60)
        password = (tmp_path / "data" / "admin_password").read_text().strip()
        token = call(f"{url}/tokens/", {"username": "admin", "password": password,
                                        "name": "test"}, method="POST")["token"]  # fmt: skip
        pref = call(f"{url}/me/notifications/", {"webhook_url": receiver.url, "email": False},
                    token, "PATCH")  # fmt: skip
        job = call(f"{url}/jobs/", {"name": "waits", "notify": ["end"], "tasks": [
            {"name": "main", "command": "true"}]}, token, "POST")  # fmt: skip
        call(f"{url}/jobs/{job['id']}/cancel/", {}, token, "POST")  # no agent: it never runs
        deadline = time.monotonic() + 30
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.2)
        assert receiver.requests, (tmp_path / "up.log").read_text()[-3000:]
        [request] = receiver.requests
        headers = {k.lower(): v for k, v in request["headers"].items()}
        signed = headers["x-berth-timestamp"].encode() + b"." + request["body"]
        mac = hmac.new(pref["webhook_secret"].encode(), signed, hashlib.sha256).hexdigest()
        assert headers["x-berth-signature"] == f"sha256={mac}"
        body = json.loads(request["body"])
        assert body["event"] == "end" and body["state"] == "Cancelled" and body["job"] == job["id"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
