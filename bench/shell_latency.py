"""Terminal sessions (docs/interactive.md#terminals-in-your-jobs): the keystroke round trip
through the server and the node's agent, with one session or many at once, and the time from
`berth shell` to the remote prompt on an idle cluster, printed as JSON.

    python bench/shell_latency.py --keys 1000 --shells 5 --sessions 1,4,16

Runs `manage.py up` (the embedded server: daphne, the scheduler loop and a real local agent
in one process, SQLite or `--database-url`, and the in-memory channel layer) in a data dir of
its own under a temporary folder, with one user and an API token.

- Keystrokes: a session in a running job runs `stty raw -echo; exec cat`, so each byte is
  echoed by a program on the far side as a shell's line editor echoes it. One byte at a time
  is sent on the user's websocket (`/ws/jobs/<id>/shell/`, as `berth attach` opens it) and
  timed until it comes back: user socket -> server -> agent socket -> pty -> cat -> pty ->
  agent -> server -> user socket.
- Sessions at once (`--sessions N`, or a list: each count in turn): N jobs, then one session
  on each, opened together; once all are open every session types its `--keys` at once (each
  waits for its byte's echo before the next). Reported per count: the round trips over all
  sessions (p50/p99/max), how many opened, every failure (a session that did not open, was
  ended by the server, stalled, or closed other than normally) and close code seen, the
  server's side of each end (its `ShellClosed` events' reasons), how the jobs ended, and the
  wall time. `--end exit` ends each session by its program exiting 0 (`dd` of exactly the
  bytes typed), as a shell's `exit`: the server must relay `{"type": "exit", "status": 0}`,
  close with 1000, and the job end Succeeded; `--end close` (default), the bench closes.
  Lines of the server's log telling of an error are listed (none is expected).
  `keystroke_round_trip` is the first count's (one session by default, as before).
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
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


HOLD = {"name": "hold", "interactive": {"persist": True},
        "tasks": [{"name": "main", "command": "exec sleep infinity",
                   "resources": {"cpu": 0, "memory": "64Mi"}}]}  # fmt: skip


def running_jobs(url: str, headers: dict[str, str], count: int) -> list[int]:
    """`count` jobs holding an allocation each, as `berth shell` submits one, once they run
    (no CPU quota and 64 MiB each, so that 16 fit on one small node; a session's processes
    join its task's cgroup)."""
    ids = []
    for _ in range(count):
        status, body = post_json(f"{url}/api/v1/jobs/", HOLD, headers)
        assert status == 201, body
        ids.append(int(body["id"]))

    def all_running() -> bool:
        return all(get_json(f"{url}/api/v1/jobs/{i}/", headers)[1]["state"] == "Running"
                   for i in ids)  # fmt: skip

    wait_for(f"{count} jobs running", all_running, timeout=120)
    return ids


def read_until(ws: Any, wanted: bytes, timeout: float = 30.0) -> None:
    got = b""
    deadline = time.monotonic() + timeout
    while wanted not in got:
        frame = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
        if isinstance(frame, bytes):
            got += frame
        elif json.loads(frame).get("type") in ("exit", "error"):
            raise SessionEnded(frame)


ECHO = "stty raw -echo; echo BENCH-READY; exec "  # then `cat`, or `dd` of <keys + 20> bytes


class SessionEnded(Exception):
    """The server ended the session (its `exit` or `error` frame) before the bench did."""


@dataclass
class Session:
    """One terminal session's outcome: opened or not, its keystrokes' round trips, and how it
    ended (`failure`: None when it opened, typed every key and closed normally)."""

    opened: bool = False
    open_s: float | None = None
    times: list[float] = field(default_factory=list)
    failure: str | None = None
    close_code: int | None = None


def one_session(url: str, token: str, job_id: int, keys: int, go: threading.Barrier,
                end: str) -> Session:  # fmt: skip
    """A session in job `job_id` on the user's socket (`/ws/jobs/<id>/shell/`, as `berth
    attach` opens it) whose program echoes each byte (`stty raw -echo; exec cat`); once every
    session of the crowd is open (or failed: `go`), each of `keys` bytes is sent alone and
    timed until it comes back (20 more first, untimed). Then, `end` "close": the bench closes
    the socket (1000); "exit": the program (`dd bs=1 count=...`) exits 0 after the last byte,
    and the server must say `{"type": "exit", "status": 0}` and close the socket (1000)."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Origin

    out = Session()
    auth = {"Authorization": f"Token {token}"}
    ws_url = url.replace("http://", "ws://") + f"/ws/jobs/{job_id}/shell/"
    try:
        with connect(ws_url, origin=Origin(url), additional_headers=auth, proxy=None,
                     compression=None, open_timeout=30) as ws:  # fmt: skip
            tick = time.perf_counter()
            command = ECHO + ("cat" if end == "close" else f"dd bs=1 count={keys + 20} status=none")
            ws.send(json.dumps({"type": "open", "rows": 24, "cols": 80, "command": command}))
            read_until(ws, b"BENCH-READY")
            out.opened, out.open_s = True, time.perf_counter() - tick
            go.wait(timeout=120)
            type_keys(ws, keys, out.times)
            out.close_code = ws.close_code if end == "close" else await_exit(ws)
            ws.close()
            out.close_code = out.close_code or ws.close_code
    except InvalidStatus as exc:
        out.failure = f"refused: HTTP {exc.response.status_code}"
    except ConnectionClosed as exc:
        out.close_code = exc.rcvd.code if exc.rcvd else None
        out.failure = f"closed by the server: {out.close_code or 'no close frame'}"
    except SessionEnded as exc:
        out.failure = f"ended by the server: {exc}"
    except TimeoutError:
        out.failure = "stalled: no answer in 30 s"
    except (OSError, threading.BrokenBarrierError) as exc:
        out.failure = f"{type(exc).__name__}: {exc}"
    if not out.opened:
        try:
            go.wait(timeout=120)  # the others type once every session opened or failed
        except threading.BrokenBarrierError:
            pass
    elif out.failure is None and out.close_code != 1000:
        out.failure = f"closed with {out.close_code}"
    return out


def await_exit(ws: Any, timeout: float = 30.0) -> int | None:
    """The session's program exited: its `exit` frame must say status 0, then the server
    closes the socket (its close code; SessionEnded on another status or an error)."""
    from websockets.exceptions import ConnectionClosedOK

    deadline = time.monotonic() + timeout
    try:
        while True:
            frame = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(frame, str) and json.loads(frame).get("type") in ("exit", "error"):
                if json.loads(frame) != {"type": "exit", "status": 0}:
                    raise SessionEnded(frame)
    except ConnectionClosedOK:
        return int(ws.close_code)


def type_keys(ws: Any, keys: int, times: list[float]) -> None:
    for index in range(keys + 20):  # the first 20 warm the path up, untimed
        key = bytes([ord("a") + index % 26])
        tick = time.perf_counter()
        ws.send(key)
        read_until(ws, key)
        if index >= 20:
            times.append(time.perf_counter() - tick)


def crowd(url: str, token: str, job_ids: list[int], keys: int, end: str) -> dict[str, Any]:
    """One session on each job at once, `keys` keystrokes each, all typing together: the
    round trips over all sessions, how many opened, every failure and close code seen, and
    the wall time from the first connection to the last close."""
    go = threading.Barrier(len(job_ids))
    began = time.perf_counter()
    with ThreadPoolExecutor(len(job_ids)) as pool:
        done = list(pool.map(lambda job: one_session(url, token, job, keys, go, end), job_ids))
    wall = time.perf_counter() - began
    times = [t for s in done for t in s.times]
    opens = [s.open_s for s in done if s.open_s is not None]
    return {
        "sessions": len(job_ids), "opened": len(opens), "keys_per_session": keys, "end": end,
        "keystroke_round_trip": percentiles(times) if times else None,
        "open_s": {"median": round(statistics.median(opens), 3),
                   "max": round(max(opens), 3)} if opens else None,
        "failures": dict(Counter(s.failure for s in done if s.failure)),
        "close_codes": dict(Counter(str(s.close_code) for s in done)),
        "server_closed": {}, "wall_s": round(wall, 3),
    }  # fmt: skip


def closed_on_server(url: str, headers: dict[str, str], job_ids: list[int],
                     expected: int) -> dict[str, int]:  # fmt: skip
    """The reasons of the jobs' `ShellClosed` events (the server's side of each session's
    end: `Disconnected` when the bench closed it), once `expected` are there or 15 s passed."""
    reasons: Counter[str] = Counter()

    def count() -> bool:
        reasons.clear()
        for job_id in job_ids:
            _, body = get_json(f"{url}/api/v1/jobs/{job_id}/events/?page_size=100", headers)
            rows = body.get("results", body) if isinstance(body, dict) else body
            reasons.update(r["reason"] for r in rows if r["kind"] == "ShellClosed")
        return sum(reasons.values()) >= expected

    try:
        wait_for("the sessions' ends", count, timeout=15)
    except RuntimeError:
        pass
    return dict(reasons)


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
    try:
        child.expect(pexpect.EOF)
    except pexpect.TIMEOUT:  # say where it stopped: what the CLI showed, the server's log
        log = (tmp / "up.log").read_bytes().decode(errors="replace")
        raise RuntimeError(f"berth shell did not end 60 s after `exit`; it showed"
                           f" {child.before[-300:]!r}; the server's log ends:\n{log[-2500:]}"
                           ) from None  # fmt: skip
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


def parse_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise ValueError(text)
    return counts


def measure(url: str, token: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The `berth shell` runs, then each crowd of sessions in turn, on jobs of its own."""
    headers = {"Authorization": f"Token {token}"}
    wait_for("the local agent's node", lambda: node_ready(url, headers))
    shells = [shell_to_prompt(url, token, tmp) for _ in range(args.shells)]
    crowds = []
    for count in args.sessions:
        job_ids = running_jobs(url, headers, count)
        row = crowd(url, token, job_ids, args.keys, args.end)
        row["server_closed"] = closed_on_server(url, headers, job_ids, row["opened"])
        row["jobs_ended"] = end_jobs(url, headers, job_ids)
        crowds.append(row)
    return {"shells": shells, "crowds": crowds, "log_size": (tmp / "up.log").stat().st_size}


def end_jobs(url: str, headers: dict[str, str], job_ids: list[int]) -> dict[str, int]:
    """The crowd's jobs cancelled (those still running: after `--end exit` each ends with its
    session, Succeeded) and waited for: the states they ended in."""
    ended = ("Succeeded", "Failed", "Cancelled")
    states: dict[int, str] = {}

    def all_ended() -> bool:
        for job_id in job_ids:
            states[job_id] = get_json(f"{url}/api/v1/jobs/{job_id}/", headers)[1]["state"]
        return all(state in ended for state in states.values())

    all_ended()
    for job_id, state in list(states.items()):
        if state not in (*ended, "Terminating"):  # a cancel would say how a Terminating ends
            post_json(f"{url}/api/v1/jobs/{job_id}/cancel/", None, headers)
    wait_for("the jobs' ends", all_ended, timeout=60)
    return dict(Counter(states.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000, help="keystrokes timed (per session)")
    parser.add_argument("--shells", type=int, default=5, help="`berth shell` runs timed (0: none)")
    parser.add_argument(
        "--sessions",
        default="1",
        help="terminal sessions open at once, each on a job of its own, all typing --keys"
        " keystrokes together; a list (1,4,16) measures each count in turn",
    )
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
    parser.add_argument(
        "--end",
        choices=["close", "exit"],
        default="close",
        help="how each session ends: the bench closes its socket (close), or its program"
        " exits 0 after the last keystroke, as a shell's `exit` (exit)",
    )
    parser.add_argument("--server-log", default=None, help="copy the server's log here")
    args = parser.parse_args()
    try:
        args.sessions = parse_counts(args.sessions)
    except ValueError:
        parser.error("--sessions: counts of at least 1, separated by commas")
    if args.keys < 1 or args.shells < 0:
        parser.error("--keys must be at least 1, --shells 0 or more")
    with tempfile.TemporaryDirectory(prefix="berth-shell-bench-") as folder:
        tmp = Path(folder)
        proc, url, token, _ = start_server(tmp, args.scheduler_interval, args.database_url)
        try:
            found = measure(url, token, tmp, args)
        finally:
            stop_groups([proc])
        log = (tmp / "up.log").read_bytes().decode(errors="replace")
        if args.server_log:
            shutil.copyfile(tmp / "up.log", args.server_log)
    result = report(args, found["shells"], found["crowds"])
    result["server_log_errors"] = log_errors(log[: found["log_size"]])
    result["server_log_errors_stopping"] = log_errors(log[found["log_size"] :])
    print(json.dumps(result, indent=1))


def log_errors(text: str, most: int = 20) -> list[str]:
    """The lines of the server's log that tell of an error (a traceback, an ERROR record, a
    5xx): none is expected, however many sessions (`server_log_errors`: while measuring;
    `server_log_errors_stopping`: once the jobs ended, while the server stopped)."""
    wanted = ("Traceback", "ERROR", "Error:", "Exception", '" 50', "HTTP 5", "never retrieved")
    found = [line.strip() for line in text.splitlines()
             if any(word in line for word in wanted)]  # fmt: skip
    return found[:most] + ([f"... {len(found) - most} more"] if len(found) > most else [])


def report(args: argparse.Namespace, shells: list[dict[str, Any]],
           crowds: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The JSON printed: `keystroke_round_trip` is the first count's (one session by default,
    as before `--sessions`), `sessions` a row per count."""
    prompts = [s["prompt_s"] for s in shells]
    to_prompt = {"runs": shells, "median_s": round(statistics.median(prompts), 3),
                 "max_s": max(prompts)} if shells else None  # fmt: skip
    return {
        "bench": "shell_latency",
        "server": "manage.py up (daphne, {}, in-memory layer, local agent)".format(
            "PostgreSQL" if args.database_url else "SQLite"
        ),
        "scheduler_interval_s": args.scheduler_interval or 1.0,
        "keystroke_round_trip": crowds[0]["keystroke_round_trip"],
        "shell_to_prompt": to_prompt,
        "sessions": crowds,
    }


if __name__ == "__main__":
    main()
