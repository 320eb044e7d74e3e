"""Terminal sessions (docs/interactive.md#terminals-in-your-jobs): the keystroke round trip
through the server and the node's agent, and the time from `berth shell` to the remote
prompt on an idle cluster, printed as JSON.

    python bench/shell_latency.py --keys 1000 --shells 5

Runs `manage.py up` (the embedded server: daphne, the scheduler loop and a real local agent
in one process, SQLite and the in-memory channel layer) in a data dir of its own under a
temporary folder, with one user and an API token.

- Keystrokes: a session in a running job runs `stty raw -echo; exec cat`, so each byte is
  echoed by a program on the far side as a shell's line editor echoes it. One byte at a time
  is sent on the user's websocket (`/ws/jobs/<id>/shell/`, as `berth attach` opens it) and
  timed until it comes back: user socket -> server -> agent socket -> pty -> cat -> pty ->
  agent -> server -> user socket.
- Prompt: `berth shell -- env PS1=... bash --norc --noprofile -i` on a pseudo-terminal
  (pexpect), timed from the process's start to the prompt (the CLI's start, the submit, the
  scheduler placing the job, the agent starting its task, the wait for Running, the session
  ordered through the agent's lease and opened, bash starting); the job ends with the
  session (`exit`) before the next one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BENCH_SECRET_KEY, post_json  # noqa: E402
from bench.processes import free_port, stop_groups, wait_until_serving  # noqa: E402

BERTH = str(Path(sys.executable).with_name("berth"))
PROMPT = "berth-bench-ready> "
MAKE_USER = (
    "from django.contrib.auth.models import User;"
    "from rest_framework.authtoken.models import Token;"
    "print(Token.objects.create(user=User.objects.create_user('bench')).key)"
)


def get_json(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    return post_json(url, None, headers, method="GET")


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    at = min(len(ordered) - 1, int(len(ordered) * 0.99))
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[at] * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2),
            "n": len(ordered)}  # fmt: skip


def start_server(
    tmp: Path, interval: float | None, database_url: str | None = None
) -> tuple[subprocess.Popen[bytes], str, str, dict[str, str]]:
    """`manage.py up` on a free port (its scheduler cycling every `interval` seconds, None:
    the default; on `database_url`, else SQLite); returns it, its URL, a user's token and
    the env."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "BERTH_TEST_DB_NAME")}  # fmt: skip
    if database_url:
        env["DATABASE_URL"] = database_url
    env.update({"BERTH_DATA_DIR": str(tmp / "data"), "BERTH_SECRET_KEY": BENCH_SECRET_KEY,
                "BERTH_JOIN_TOKEN": "bench-join-token", "PYTHONUNBUFFERED": "1"})  # fmt: skip
    if interval is not None:
        env["BERTH_SCHEDULER_INTERVAL"] = str(interval)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    token = subprocess.run([*manage, "shell", "-c", MAKE_USER], env=env, cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()[-1]  # fmt: skip
    port = free_port()
    log = tmp / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*manage, "up", "--port", str(port), "--agent-work-dir", str(tmp / "tasks")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(url, proc, log, timeout=60)
    return proc, url, token, env


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def node_ready(url: str, headers: dict[str, str]) -> bool:
    status, body = get_json(f"{url}/api/v1/nodes/", headers)
    rows = body.get("results", body) if isinstance(body, dict) else body
    return status == 200 and any(n.get("state") == "Ready" for n in rows)


def running_job(url: str, headers: dict[str, str]) -> int:
    """A job holding the allocation, as `berth shell` submits one, once it runs."""
    spec = {"name": "hold", "interactive": {"persist": True},
            "tasks": [{"name": "main", "command": "exec sleep infinity"}]}  # fmt: skip
    status, body = post_json(f"{url}/api/v1/jobs/", spec, headers)
    assert status == 201, body
    job_id = int(body["id"])
    path = f"{url}/api/v1/jobs/{job_id}/"
    wait_for(f"job {job_id} running", lambda: get_json(path, headers)[1]["state"] == "Running")
    return job_id


def read_until(ws: Any, wanted: bytes, timeout: float = 30.0) -> None:
    got = b""
    deadline = time.monotonic() + timeout
    while wanted not in got:
        frame = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
        if isinstance(frame, bytes):
            got += frame
        elif json.loads(frame).get("type") in ("exit", "error"):
            raise RuntimeError(f"session ended: {frame}")


def keystrokes(url: str, token: str, job_id: int, keys: int) -> dict[str, float]:
    """Each of `keys` bytes sent alone on the user's socket and timed until it comes back."""
    from websockets.sync.client import connect
    from websockets.typing import Origin

    ws_url = url.replace("http://", "ws://") + f"/ws/jobs/{job_id}/shell/"
    times = []
    with connect(ws_url, origin=Origin(url), additional_headers={"Authorization": f"Token {token}"},
                 proxy=None, compression=None) as ws:  # fmt: skip
        ws.send(json.dumps({"type": "open", "rows": 24, "cols": 80,
                            "command": "stty raw -echo; echo BENCH-READY; exec cat"}))  # fmt: skip
        read_until(ws, b"BENCH-READY")
        for index in range(keys + 20):  # the first 20 warm the path up, untimed
            key = bytes([ord("a") + index % 26])
            tick = time.perf_counter()
            ws.send(key)
            read_until(ws, key)
            if index >= 20:
                times.append(time.perf_counter() - tick)
    return percentiles(times)


def shell_to_prompt(url: str, token: str, tmp: Path) -> dict[str, Any]:
    """`berth shell` started on a pseudo-terminal, timed to the remote prompt."""
    import pexpect

    env = {**os.environ, "BERTH_URL": url, "BERTH_TOKEN": token, "TERM": "xterm",
           "XDG_CONFIG_HOME": str(tmp / "config")}  # fmt: skip
    command = ["shell", "--", "env", f"PS1={PROMPT}", "bash", "--norc", "--noprofile", "-i"]
    tick = time.perf_counter()
    child = pexpect.spawn(BERTH, command, env=env, timeout=60, cwd=str(tmp))
    child.expect(r"Submitted interactive job (\d+)")
    submitted = time.perf_counter() - tick
    job_id = int(child.match.group(1))
    child.expect_exact(PROMPT)
    prompt = time.perf_counter() - tick
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    return {"submitted_s": round(submitted, 3), "prompt_s": round(prompt, 3),
            "server_s": milestones(url, token, job_id)}  # fmt: skip


def milestones(url: str, token: str, job_id: int) -> dict[str, float]:
    """When the job's events happened, in seconds after its submission (the server's clock):
    where the time to the prompt went."""
    from datetime import datetime

    headers = {"Authorization": f"Token {token}"}
    _, job = get_json(f"{url}/api/v1/jobs/{job_id}/", headers)
    _, body = get_json(f"{url}/api/v1/jobs/{job_id}/events/?page_size=100", headers)
    rows = body.get("results", body) if isinstance(body, dict) else body
    start = datetime.fromisoformat(job["created_at"])
    wanted = {"Scheduled": "placed", "TaskStarted": "task_started", "ShellOpened": "session_open"}
    found = {}
    for row in rows:
        name = wanted.get(row["kind"]) or (
            "job_running" if "-> Running" in row.get("message", "") else None
        )
        if name and name not in found:
            found[name] = round((datetime.fromisoformat(row["time"]) - start).total_seconds(), 3)
    return dict(sorted(found.items(), key=lambda item: item[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000, help="keystrokes timed")
    parser.add_argument("--shells", type=int, default=5, help="`berth shell` runs timed")
    parser.add_argument(
        "--scheduler-interval",
        type=float,
        default=None,
        help="BERTH_SCHEDULER_INTERVAL for the server (default: its own, 1 s)",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="an EMPTY PostgreSQL database for the server (default: SQLite in a temporary"
        " folder); on PostgreSQL the scheduler is woken by its triggers' notifications",
    )
    args = parser.parse_args()
    if args.keys < 1 or args.shells < 1:
        parser.error("--keys and --shells must be at least 1")
    with tempfile.TemporaryDirectory(prefix="berth-shell-bench-") as folder:
        tmp = Path(folder)
        proc, url, token, _ = start_server(tmp, args.scheduler_interval, args.database_url)
        try:
            headers = {"Authorization": f"Token {token}"}
            wait_for("the local agent's node", lambda: node_ready(url, headers))
            shells = [shell_to_prompt(url, token, tmp) for _ in range(args.shells)]
            job_id = running_job(url, headers)
            keys = keystrokes(url, token, job_id, args.keys)
            post_json(f"{url}/api/v1/jobs/{job_id}/cancel/", None, headers)
        finally:
            stop_groups([proc])
    prompts = [s["prompt_s"] for s in shells]
    result = {
        "bench": "shell_latency",
        "server": "manage.py up (daphne, {}, in-memory layer, local agent)".format(
            "PostgreSQL" if args.database_url else "SQLite"
        ),
        "scheduler_interval_s": args.scheduler_interval or 1.0,
        "keystroke_round_trip": keys,
        "shell_to_prompt": {
            "runs": shells,
            "median_s": round(statistics.median(prompts), 3),
            "max_s": max(prompts),
        },  # fmt: skip
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
