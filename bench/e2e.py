"""End to end under load, side by side with Slurm: the production layout on PostgreSQL and
Redis, concurrent clients submitting short jobs, simulated nodes running them.

Starts as real processes: `./run serve` (the production web tier), `run_scheduler` and
`run_simagent` (fake nodes over the agent protocol). Measures the agents' traffic at rest,
then C clients submit J one-GPU jobs of D seconds and wait until every job has ended, then one
array of A elements is submitted. Prints one JSON object with accepted/s, finished/s end to
end, submit latency p50/p99, every HTTP status seen, cycle phases p50/p99, wait-to-start
p50/p99, PostgreSQL connections (at rest, peak, after), agent requests/s at rest, queue depth
over time, and the same load through Slurm (`bench/slurm_peer.py`) with the ratio.

    python bench/e2e.py --nodes 100 --gpus 8 --jobs 800 --clients 16 --duration 0.5 \
        --array 10000 > e2e.json
    python bench/plot_timeline.py e2e.json docs/e2e-timeline.svg

Uses a database of its own (DATABASE_URL's server, database `--database-name`, default
`berth_bench`), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu_use  # noqa: E402
import slurm_peer  # noqa: E402
from processes import add_database_options, free_port, stop_groups  # noqa: E402

from scheduler.agent.client import Backoff, parse_retry_after  # noqa: E402

FINAL = ("Succeeded", "Failed", "Cancelled")
MANAGE = [sys.executable, str(ROOT / "manage.py")]
APP = "berth-bench"  # this script's own PostgreSQL connections, left out of the counts


def pct(values: list[float], q: float, scale: float = 1.0) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per simulated node")
    parser.add_argument("--cpu", default="64", help="cpu per simulated node")
    parser.add_argument("--memory", default="512Gi", help="memory per simulated node")
    parser.add_argument("--jobs", type=int, default=800)
    parser.add_argument("--clients", type=int, default=16, help="concurrent submitting clients")
    parser.add_argument("--duration", type=float, default=0.5, help="seconds each job runs")
    parser.add_argument("--array", type=int, default=10000, help="array elements (0: none)")
    parser.add_argument("--workers", type=int, default=None, help="./run serve --workers")
    parser.add_argument("--interval", type=float, default=0.2, help="scheduler interval (s)")
    parser.add_argument("--rest-seconds", type=float, default=30.0,
                        help="how long to count the agents' requests at rest")  # fmt: skip
    parser.add_argument("--peer", choices=["slurm", "none"], default="slurm")
    parser.add_argument("--slurm-slots", type=int, default=64, help="CPUs Slurm may fill")
    parser.add_argument("--timeout", type=float, default=600)
    add_database_options(parser, "berth_bench")
    args = parser.parse_args()
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.database_name):
        parser.error("--database-name: lower-case letters, digits and _")
    for name in ("nodes", "jobs", "clients"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


class Processes:
    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, cmd: list[str]) -> None:
        out = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(cmd, env=self.env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.procs.append(proc)

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        stop_groups(self.procs, timeout=15)


class Database:
    """The bench's own window on PostgreSQL: job states and the server's connections."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name=APP)

    def one(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def connections(self) -> int:
        return int(self.one("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND application_name <> %s", APP))  # fmt: skip

    def states(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT state, count(*) FROM scheduler_job GROUP BY state")
        return {state: n for state, n in rows.fetchall()}


class Submitter:
    """C clients posting job specs; every status seen is counted, 429/503 are waited out as
    the server asks (with jitter) and sent again."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.statuses: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.lock = threading.Lock()

    def post(self, http: httpx.Client, body: dict[str, Any]) -> dict[str, Any] | None:
        backoff = Backoff(base=0.2, cap=10.0)
        started = time.monotonic()
        for _ in range(30):
            try:
                response = http.post("/api/v1/jobs/", json=body)
                code = str(response.status_code)
            except (httpx.ConnectError, httpx.TimeoutException) as exc:
                response, code = None, type(exc).__name__  # refused or slow: try again
            with self.lock:
                self.statuses[code] += 1
            if response is not None and response.status_code < 400:
                with self.lock:
                    self.latencies.append(time.monotonic() - started)
                return dict(response.json())
            if response is not None and response.status_code not in (429, 503):
                if self.statuses[code] == 1:
                    say(f"first {code}: {response.text[:300]}")
                return None
            wait = parse_retry_after(response.headers.get("Retry-After")) if response else None
            time.sleep(backoff.delay(wait))
        return None

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Token {self.token}"})  # fmt: skip


def job_body(duration: float, array: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "bench",
        "tasks": [{"name": "main", "command": "true",
                   "resources": {"cpu": "0.5", "memory": "1Gi", "gpu": 1},
                   "env": {"BERTH_SIM_DURATION": str(duration)}}],
    }  # fmt: skip
    if array:
        body["name"] = "bench-array"
        body["array"] = f"0-{array - 1}"
    return body


def cycle_phases(log: str) -> dict[str, dict[str, float | None]]:
    """p50/p99 of each `name=12.3ms` phase over the scheduler's busy cycle lines."""
    phases: dict[str, list[float]] = {}
    for line in log.splitlines():
        if " cycle " not in f" {line} ":
            continue
        for name, ms in re.findall(r"(\w+)=([\d.]+)ms", line):
            phases.setdefault(name, []).append(float(ms))
    return {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)}
            for name, v in phases.items()}  # fmt: skip


def say(what: str) -> None:
    """Progress on stderr, so stdout stays one JSON object."""
    print(f"[e2e {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def prepare_database(args: argparse.Namespace) -> tuple[str, dict[str, str], Path]:
    """A fresh `berth_bench` database, migrated; the environment of every process."""
    base = args.database.rsplit("/", 1)[0]
    db_url = f"{base}/{args.database_name}"
    work = Path(tempfile.mkdtemp(prefix="berth-e2e-"))
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": args.redis,
        "BERTH_SECRET_KEY": "bench-" + os.urandom(32).hex(),
        "BERTH_JOIN_TOKEN": "bench-join-" + os.urandom(8).hex(),
        "BERTH_SCHEDULER_INTERVAL": str(args.interval),
        "BERTH_DATA_DIR": str(work),
        "BERTH_CHANNEL_PREFIX": "berth-bench",
        "PYTHONUNBUFFERED": "1",
    }
    import psycopg

    with psycopg.connect(args.database, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database_name}"')
    subprocess.run([*MANAGE, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    return db_url, env, work


def make_token(env: dict[str, str]) -> str:
    """A user `bench` and its DRF token, as a script's user would have."""
    return (
        subprocess.run(
            [
                *MANAGE,
                "shell",
                "-c",
                "from django.contrib.auth.models import User;"
                "from rest_framework.authtoken.models import Token;"
                "print(Token.objects.create(user=User.objects.create_user('bench')).key)",
            ],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )  # after what the shell says about its imports


def start_cluster(args: argparse.Namespace, procs: Processes, url: str, db: Database) -> None:
    """`./run serve`, then the simulated nodes, then the scheduler, each once ready."""
    serve = [str(ROOT / "run"), "serve", "--port", url.rsplit(":", 1)[1]]
    if args.workers:
        serve += ["--workers", str(args.workers)]
    procs.start("web", serve)
    say(f"serving on {url}; logs in {procs.work}")
    wait_until(lambda: _up(url), 60, "the web server")
    procs.start("simagent", [*MANAGE, "run_simagent", "--server", url, "--nodes",
                             str(args.nodes), "--gpus", str(args.gpus), "--cpu", args.cpu,
                             "--memory", args.memory])  # fmt: skip
    wait_until(lambda: db.one("SELECT count(*) FROM scheduler_node WHERE state = 'Ready'")
               >= args.nodes, 120, "nodes to register")  # fmt: skip
    procs.start("scheduler", [*MANAGE, "run_scheduler", "--interval", str(args.interval)])


def run_berth(args: argparse.Namespace) -> dict[str, Any]:
    db_url, env, work = prepare_database(args)
    token = make_token(env)
    db = Database(db_url)
    url = f"http://127.0.0.1:{free_port()}"
    procs = Processes(work, env)
    try:
        start_cluster(args, procs, url, db)
        return measure(args, procs, url, token, db)
    finally:
        procs.stop()


def measure(
    args: argparse.Namespace, procs: Processes, url: str, token: str, db: Database
) -> dict[str, Any]:
    """At rest, then the load, then the array; figures from the logs at the end."""
    say(f"{args.nodes} nodes ready; counting agent requests at rest")
    rest = _agents_at_rest(db, args.rest_seconds)
    sent_before = agent_requests(procs)
    say(f"{args.clients} clients submit {args.jobs} jobs")
    result = _load(args, url, token, db)
    say("every job ended")
    result["agent_requests"] = requests_per_job(
        sent_before, agent_requests(procs), result, rest["requests_per_s"]
    )
    result["agent_requests_per_s_at_rest"] = rest["requests_per_s"]
    result["connections"]["at_rest"] = rest["connections"]
    if args.array:
        result["array"] = _array(args, url, token, db)
    time.sleep(5)  # let pools shrink back and idle connections close
    result["connections"]["after"] = db.connections()
    result["cycle_ms"] = cycle_phases(procs.log("scheduler"))
    result["server_5xx_in_log"] = len(re.findall(r'" 5\d\d ', procs.log("web")))
    return result


def agent_requests(procs: Processes) -> dict[str, int]:
    """What the simulated agents sent so far, by kind, from their latest `requests sent:`
    line (logged every 2 s while it changes; waited for, so it is current)."""
    time.sleep(2.5)
    lines = re.findall(r"requests sent: (.*)", procs.log("simagent"))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])} if lines else {}


def requests_per_job(
    before: dict[str, int], after: dict[str, int], load: dict[str, Any], rest_per_s: float
) -> dict[str, Any]:
    """Agent requests while the load ran, by kind and per job; `per_job_beyond_rest` leaves
    out the lease renewals the nodes would have sent idle over the same time."""
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    jobs = max(1, int(load["accepted"]))
    idle = rest_per_s * (load["end_to_end_seconds"] + 5.0)  # + the two 2.5 s waits
    return {
        "during_load": sent,
        "per_job": round(sum(sent.values()) / jobs, 2),
        "per_job_beyond_rest": round(max(0.0, sum(sent.values()) - idle) / jobs, 2),
    }


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/schema/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _agents_at_rest(db: Database, seconds: float) -> dict[str, Any]:
    """Agent requests per second with no work: each request renews its node's lease
    (`last_heartbeat`), so count lease renewals seen by sampling every node twice a second."""

    def leases() -> dict[int, Any]:
        rows = db.conn.execute("SELECT id, last_heartbeat FROM scheduler_node").fetchall()
        return {int(node): at for node, at in rows}

    seen = leases()
    renewals = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(0.5)
        now = leases()
        renewals += sum(1 for k, v in now.items() if seen.get(k) != v)
        seen = now
    return {"requests_per_s": round(renewals / seconds, 2), "connections": db.connections()}


class QueueSampler:
    """Twice a second: jobs Pending, Running and finished, and the peak of connections."""

    def __init__(self, db: Database) -> None:
        self.db, self.peak = db, 0
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            states = self.db.states()
            self.peak = max(self.peak, self.db.connections())
            self.samples.append({"t": round(time.monotonic() - self.t0, 2),
                                 "pending": states.get("Pending", 0),
                                 "running": states.get("Running", 0),
                                 "finished": sum(states.get(s, 0) for s in FINAL)})  # fmt: skip
            self.done.wait(0.5)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _submit_all(args: argparse.Namespace, submitter: Submitter) -> int:
    """C clients share the J jobs; returns how many were accepted."""
    body = job_body(args.duration)
    per_client = [args.jobs // args.clients + (i < args.jobs % args.clients)
                  for i in range(args.clients)]  # fmt: skip

    def client_loop(n: int) -> int:
        with submitter.client() as http:
            return sum(1 for _ in range(n) if submitter.post(http, body) is not None)

    with ThreadPoolExecutor(args.clients) as pool:
        return sum(pool.map(client_loop, per_client))


def _load(args: argparse.Namespace, url: str, token: str, db: Database) -> dict[str, Any]:
    submitter = Submitter(url, token)
    cpu_before = cpu_use.snapshot()
    sampler = QueueSampler(db)
    accepted = _submit_all(args, submitter)
    submit_s = time.monotonic() - sampler.t0
    say(f"{accepted} accepted in {submit_s:.1f}s; waiting for them to end")
    wait_until(lambda: db.one("SELECT count(*) FROM scheduler_job WHERE state IN "
                              "('Succeeded','Failed','Cancelled')") >= accepted,
               args.timeout, "every job to end")  # fmt: skip
    total_s = time.monotonic() - sampler.t0
    cpu = cpu_use.used(cpu_before, cpu_use.snapshot())
    sampler.stop()
    rows = db.conn.execute(
        "SELECT extract(epoch FROM started_at - created_at), state FROM scheduler_job"
    ).fetchall()
    waits = [float(w) for w, _ in rows if w is not None]
    return {
        "nodes": args.nodes, "gpus_per_node": args.gpus, "jobs": args.jobs,
        "clients": args.clients, "job_duration_s": args.duration,
        "accepted": accepted,
        "accepted_per_s": round(accepted / submit_s, 1),
        "finished_per_s": round(accepted / total_s, 1),
        "end_to_end_seconds": round(total_s, 2),
        "succeeded": sum(1 for _, s in rows if s == "Succeeded"),
        "submit_latency_ms": {"p50": pct(submitter.latencies, 0.5, 1000),
                              "p99": pct(submitter.latencies, 0.99, 1000)},
        "status_codes": dict(submitter.statuses),
        "wait_to_start_s": {"p50": pct(waits, 0.5), "p99": pct(waits, 0.99)},
        "connections": {"peak": sampler.peak},
        "cpu_ms_per_job": {role: round(1000 * s / max(accepted, 1), 2) for role, s in cpu.items()}
        | {"all": round(1000 * sum(cpu.values()) / max(accepted, 1), 2), "cores": os.cpu_count()},
        "queue_depth": sampler.samples,
    }  # fmt: skip


def _array(args: argparse.Namespace, url: str, token: str, db: Database) -> dict[str, Any]:
    submitter = Submitter(url, token)
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=300,
                      headers={"Authorization": f"Token {token}"}) as http:  # fmt: skip
        created = submitter.post(http, job_body(args.duration, args.array))
    seconds = time.monotonic() - t0
    return {"elements": args.array, "accepted": created is not None,
            "seconds": round(seconds, 3),
            "elements_per_s": round(args.array / seconds, 1) if created else 0,
            "status_codes": dict(submitter.statuses)}  # fmt: skip


def main() -> None:
    args = parse_args()
    result: dict[str, Any] = {"berth": run_berth(args)}
    if args.peer == "slurm":
        peer = slurm_peer.run(args.jobs, args.clients, args.duration, args.slurm_slots,
                              args.timeout)  # fmt: skip
        result["slurm"] = peer
        if "skipped" not in peer:
            b = result["berth"]
            result["ratio_berth_to_slurm"] = {
                k: round(b[k] / peer[k], 2) if peer[k] else None
                for k in ("accepted_per_s", "finished_per_s")
            }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
