"""Agent traffic at rest: N simulated nodes with nothing to run, against a real server.

Starts the web server (daphne, with its access log) as a real process, then runs N fake
nodes in this process (scheduler.agent.sim, over HTTP). After a warm-up (registration, first
reports) it counts requests for a while, both as the agents sent them and as the server
logged them, and prints one JSON object: requests/s in total and per endpoint.

    python bench/agent_rest.py --nodes 100 --seconds 60

Uses DATABASE_URL/REDIS_URL when set (a PostgreSQL database must already be migrated, as
for `manage.py migrate`); otherwise a throwaway SQLite database in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, start_daphne  # noqa: E402
from scheduler.agent import client  # noqa: E402  (Django-free)
from scheduler.agent.sim import SimCluster  # noqa: E402

SENT: Counter[str] = Counter()
_lock = threading.Lock()
_post = client.Http.post


def counting_post(self: client.Http, path: str, *args: Any, **kw: Any) -> dict[str, Any]:
    with _lock:
        SENT["log/" if path.startswith("tasks/") else path] += 1
    return _post(self, path, *args, **kw)


def server_requests(log: Path) -> Counter[str]:
    seen: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        for path in ("register/", "report/", "lease/", "log/"):
            marker = "/tasks/" if path == "log/" else f"/api/v1/agent/{path}"
            if marker in line:
                seen[path] += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to count")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before counting")
    parser.add_argument("--lease", type=float, default=10.0, help="BERTH_HEARTBEAT_INTERVAL")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()
    port = args.port or free_port()
    tmp = Path(tempfile.mkdtemp(prefix="berth-agent-rest-"))
    join = secrets.token_urlsafe(16)
    env = {
        **os.environ,
        "BERTH_JOIN_TOKEN": join,
        "BERTH_DATA_DIR": str(tmp),
        "BERTH_HEARTBEAT_INTERVAL": str(args.lease),
        "DJANGO_SETTINGS_MODULE": "berth.settings",
        "BERTH_SECRET_KEY": os.environ.get("BERTH_SECRET_KEY") or secrets.token_urlsafe(40),
    }
    env.pop("BERTH_HEARTBEAT_TIMEOUT", None)
    if "DATABASE_URL" not in os.environ:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)  # fmt: skip
    access = tmp / "access.log"
    server = start_daphne(port, env, tmp / "server.log", access_log=access, timeout=60)
    client.Http.post = counting_post  # type: ignore[method-assign]
    stop = threading.Event()
    try:
        cluster = SimCluster(f"http://127.0.0.1:{port}", join, nodes=args.nodes, gpus=8,
                             cpu=64000, memory=512 * 2**30, prefix="rest")  # fmt: skip
        thread = threading.Thread(target=cluster.run, args=(stop,), daemon=True)
        thread.start()
        time.sleep(args.warmup)
        sent_before, logged_before = Counter(SENT), server_requests(access)
        time.sleep(args.seconds)
        sent = Counter(SENT) - sent_before
        logged = server_requests(access) - logged_before
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=20)
    print(json.dumps({
        "nodes": args.nodes,
        "lease_seconds": args.lease,
        "window_seconds": args.seconds,
        "requests_per_second": round(sum(sent.values()) / args.seconds, 2),
        "server_logged_per_second": round(sum(logged.values()) / args.seconds, 2),
        "per_endpoint_per_second": {k: round(v / args.seconds, 2) for k, v in sorted(sent.items())},
        "per_node_per_minute": round(60 * sum(sent.values()) / args.seconds / args.nodes, 2),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
