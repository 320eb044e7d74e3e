"""The parts a chaos experiment breaks, each a real process this machine runs and controls:
a throwaway PostgreSQL cluster and Redis server on ports of their own (so restarting them
touches nobody else's), Berth's production processes on top of them, a steady load of job
submissions, and the checks that count what was lost or run twice.

Used by bench/chaos.py (each fault under load, figures in docs/benchmarks.md) and by the
short cases in tests/chaos/. Needs PostgreSQL's server binaries and redis-server (Debian's
postgresql and redis-server packages); as root, PostgreSQL runs as the `postgres` account.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, stop_groups  # noqa: E402
from scheduler.agent.client import Backoff, parse_retry_after  # noqa: E402

MANAGE = [sys.executable, str(ROOT / "manage.py")]
SECRET_KEY = "chaos-tests-only-secret-key-never-in-production-0123456789"
JOIN_TOKEN = "chaos-join-token"
FINAL = {"Succeeded", "Failed", "Cancelled"}


def pg_binary(name: str) -> str:
    """A PostgreSQL server program (initdb, pg_ctl), newest version first."""
    for path in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return path
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's postgresql package")
    return found


def missing_parts() -> list[str]:
    """What this machine lacks to run the experiments (empty: nothing)."""
    missing = [] if shutil.which("redis-server") else ["redis-server"]
    try:
        pg_binary("pg_ctl")
    except RuntimeError:
        missing.append("pg_ctl")
    return missing


def _as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as `postgres` then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


class PrivatePostgres:
    """A cluster of our own in `root`, listening on 127.0.0.1:`port`."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root, self.port = root, port or free_port()
        self.data, self.log = root / "pgdata", root / "postgres.log"

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _give_to_postgres(self.root)
        subprocess.run(
            _as_postgres([pg_binary("initdb"), "-D", str(self.data), "-U", "postgres",
                          "-A", "trust", "-E", "UTF8", "--no-sync"]),  # fmt: skip
            check=True, capture_output=True,
        )  # fmt: skip
        self.start()

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
                   " -c fsync=off -c max_connections=200")  # fmt: skip
        subprocess.run(
            _as_postgres([pg_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-o", options, "-w", "-t", "60", "start"]),  # fmt: skip
            check=True, capture_output=True,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres([pg_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            check=False, capture_output=True,
        )  # fmt: skip

    def restart(self) -> None:
        self.stop()
        self.start()

    def sql(self, database: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)  # type: ignore[arg-type]
            return list(cursor.fetchall()) if cursor.description else []


class PrivateRedis:
    """A Redis server of our own on 127.0.0.1:`port`, or with `unix` on a socket in `root`
    only (any network namespace of this machine reaches it by its path)."""

    def __init__(self, root: Path, port: int | None = None, unix: bool = False) -> None:
        self.root, self.port = root, port or free_port()
        self.socket = root / "redis.sock" if unix else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.socket is not None:
            return f"unix://{self.socket}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        where = (
            ["--port", str(self.port), "--bind", "127.0.0.1"]
            if self.socket is None
            else ["--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        )
        self.proc = subprocess.Popen(
            ["redis-server", *where, "--save", "", "--appendonly", "no", "--dir", str(self.root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        if self.socket is None:
            _wait(lambda: _port_open(self.port), 10, "redis to listen")
        else:
            _wait(lambda: _socket_open(self.socket), 10, "redis to listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _socket_open(path: Path | None) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(str(path)) == 0


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - not yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Stack:
    """Berth's production layout on the private PostgreSQL and Redis: `./run serve`, two
    `run_scheduler` (a leader and a standby), simulated nodes, and real agents on demand."""

    work: Path
    pg: PrivatePostgres
    redis: PrivateRedis
    database: str
    host: str = "127.0.0.1"
    tablespace: Path | None = None  # where the database's files are, when on a volume of its own
    port: int = field(default_factory=free_port)
    user_token: str = ""  # the load's user (set by cluster())
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host == "0.0.0.0" else self.host
        return f"http://{host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("BERTH_")},
            "DATABASE_URL": self.pg.url(self.database),
            "REDIS_URL": self.redis.url,
            "BERTH_SECRET_KEY": SECRET_KEY,
            "BERTH_JOIN_TOKEN": JOIN_TOKEN,
            "BERTH_DATA_DIR": str(self.work / "data"),
            "BERTH_SCHEDULER_INTERVAL": "0.2",
            "BERTH_HEARTBEAT_INTERVAL": "1",
            "BERTH_HEARTBEAT_TIMEOUT": "6",
            "BERTH_KILL_GRACE_SECONDS": "1",
            "BERTH_LEADER_TIMEOUT": "4",
            "BERTH_DB_POOL_TIMEOUT": "2",
            # The namespaced agents of a partition reach the server at 10.231.N.1.
            "BERTH_ALLOWED_HOSTS": "127.0.0.1,localhost,10.231.7.1",
            "PYTHONUNBUFFERED": "1",
            **self.timings,
        }

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        self.procs[name] = subprocess.Popen(
            command, cwd=ROOT, env=env or self.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def up(self, nodes: int = 4, gpus: int = 2, schedulers: int = 2) -> None:
        subprocess.run([*MANAGE, "migrate", "-v0"], env=self.env(), cwd=ROOT, check=True)
        self.start("web", [sys.executable, "-m", "berth.web.serve", "--no-migrate", "--host",
                           self.host, "--port", str(self.port), "--workers", "2"])  # fmt: skip
        _wait(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code in (200, 503),
              60, "the web tier")  # fmt: skip
        if nodes:
            self.start("simagent", [*MANAGE, "run_simagent", "--server", self.url, "--nodes",
                                    str(nodes), "--gpus", str(gpus), "--cpu", "8"])  # fmt: skip
        for n in range(schedulers):
            self.start(f"scheduler-{n}", [*MANAGE, "run_scheduler", "--interval", "0.2"])
        _wait(self.healthy, 60, "/healthz to answer 200")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def token(self, username: str = "chaos") -> str:
        return subprocess.run(
            [*MANAGE, "shell", "-c",
             "from django.contrib.auth.models import User;"
             "from rest_framework.authtoken.models import Token;"
             f"u, _ = User.objects.get_or_create(username='{username}');"
             "print(Token.objects.get_or_create(user=u)[0].key)"],
            env=self.env(), cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip

    def leader(self) -> str | None:
        """The scheduler process that recorded the last cycle (its heartbeat row names the
        leader as host:pid)."""
        rows = self.pg.sql(self.database, "SELECT leader FROM scheduler_schedulerheartbeat")
        pid = str(rows[0][0]).rsplit(":", 1)[-1] if rows else ""
        for name, proc in self.procs.items():
            if name.startswith("scheduler-") and str(proc.pid) == pid:
                return name
        return None

    def last_cycle_age(self) -> float | None:
        rows = self.pg.sql(self.database, "SELECT extract(epoch FROM now() - last_cycle_at)"
                           " FROM scheduler_schedulerheartbeat")  # fmt: skip
        return float(rows[0][0]) if rows else None

    def stop(self) -> None:
        stop_groups(list(self.procs.values()), timeout=10)
        self.procs.clear()


@dataclass
class Load:
    """Clients submitting short jobs at a steady rate. Every answer is counted; 429 and 503
    are waited out as the server asks and sent again under a new name (so a job that was
    written despite its 503 would show), anything else ends that submission."""

    url: str
    token: str
    clients: int = 2
    rate: float = 4.0  # submissions per second, all clients together
    duration: float = 0.3  # each job's simulated run, seconds
    max_retry: int = 3
    statuses: Counter[str] = field(default_factory=Counter)
    accepted: dict[int, str] = field(default_factory=dict)  # job id -> name
    refused: set[str] = field(default_factory=set)  # names answered 503/429
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for n in range(self.clients):
            thread = threading.Thread(target=self._client, args=(n,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def body(self, name: str) -> dict[str, Any]:
        return {"name": name, "max_retry": self.max_retry,
                "tasks": [{"name": "main", "command": "true",
                           "resources": {"cpu": "0.1", "memory": "64Mi"},
                           "env": {"BERTH_SIM_DURATION": str(self.duration)}}]}  # fmt: skip

    def _client(self, n: int) -> None:
        period = self.clients / self.rate
        with httpx.Client(base_url=self.url, timeout=30,
                          headers={"Authorization": f"Token {self.token}"}) as http:  # fmt: skip
            seq = 0
            while not self._stop.is_set():
                started = time.monotonic()
                self._submit(http, f"c{n}-{seq}")
                seq += 1
                self._stop.wait(max(0.0, period - (time.monotonic() - started)))

    def _submit(self, http: httpx.Client, base: str) -> None:
        backoff = Backoff(base=0.2, cap=5.0)
        for attempt in range(200):
            name = f"{base}-a{attempt}"
            try:
                response = http.post("/api/v1/jobs/", json=self.body(name))
            except httpx.ConnectError:
                self._count("refused-connection")  # nothing was sent: try again
                time.sleep(backoff.delay())
                continue
            except httpx.HTTPError as exc:  # sent, answer lost: the outcome is unknown
                self._count(type(exc).__name__)
                with self._lock:
                    self.errors.append(f"{name}: {exc!r}")
                return
            self._count(str(response.status_code))
            if response.status_code == 201:
                with self._lock:
                    self.accepted[int(response.json()["id"])] = name
                return
            if response.status_code in (429, 503):
                with self._lock:
                    self.refused.add(name)
                if self._stop.is_set():
                    return
                time.sleep(backoff.delay(parse_retry_after(response.headers.get("Retry-After"))))
                continue
            with self._lock:
                self.errors.append(f"{name}: {response.status_code} {response.text[:200]}")
            return

    def _count(self, what: str) -> None:
        with self._lock:
            self.statuses[what] += 1

    @property
    def bad_5xx(self) -> int:
        """Answers 5xx other than a deliberate 503 (which carries Retry-After)."""
        return sum(n for code, n in self.statuses.items() if code.startswith("5") and code != "503")


@dataclass
class Outcome:
    """What the checks found once the queue drained."""

    accepted: int
    lost: list[int]
    written_despite_refusal: list[str]
    doubled_usage: int
    overlapping_attempts: int
    not_final: int

    def as_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "lost": len(self.lost),
                "written_despite_503": len(self.written_despite_refusal),
                "doubled_usage_records": self.doubled_usage,
                "overlapping_attempts": self.overlapping_attempts,
                "not_final": self.not_final}  # fmt: skip


def job_states(stack: Stack, ids: list[int]) -> dict[int, str]:
    if not ids:
        return {}
    rows = stack.pg.sql(stack.database, "SELECT id, state FROM scheduler_job WHERE id = ANY(%s)",
                        ids)  # fmt: skip
    return {int(pk): str(state) for pk, state in rows}


def wait_drained(stack: Stack, load: Load, timeout: float) -> float:
    """Seconds until every accepted job is final (TimeoutError past `timeout`)."""
    started = time.monotonic()
    ids = list(load.accepted)

    def drained() -> bool:
        states = job_states(stack, ids)
        return len(states) == len(ids) and all(s in FINAL for s in states.values())

    _wait(drained, timeout, "the queue to drain")
    return time.monotonic() - started


def check(stack: Stack, load: Load) -> Outcome:
    ids = list(load.accepted)
    states = job_states(stack, ids)
    lost = [pk for pk in ids if states.get(pk) != "Succeeded"]
    names = {str(r[0]) for r in stack.pg.sql(stack.database, "SELECT name FROM scheduler_job")}
    doubled = stack.pg.sql(
        stack.database,
        "SELECT count(*) FROM (SELECT task_id, attempt FROM scheduler_usagerecord"
        " GROUP BY task_id, attempt HAVING count(*) > 1) d",
    )[0][0]
    overlapping = stack.pg.sql(
        stack.database,
        "SELECT count(*) FROM scheduler_usagerecord a JOIN scheduler_usagerecord b"
        " ON a.task_id = b.task_id AND a.attempt < b.attempt"
        " AND b.started_at < a.finished_at - interval '50 milliseconds'",
    )[0][0]
    return Outcome(
        accepted=len(ids),
        lost=lost,
        written_despite_refusal=sorted(load.refused & names),
        doubled_usage=int(doubled),
        overlapping_attempts=int(overlapping),
        not_final=sum(1 for s in states.values() if s not in FINAL),
    )


@contextmanager
def cluster(work: Path, nodes: int = 4, schedulers: int = 2,
            timings: dict[str, str] | None = None, host: str = "127.0.0.1",
            tablespace: Path | None = None) -> Iterator[Stack]:  # fmt: skip
    """A private PostgreSQL and Redis, and Berth's production processes on them (the web
    tier listening on `host`; the database's files in `tablespace` when given)."""
    work.mkdir(parents=True, exist_ok=True)
    # Its own folder under /tmp: the `postgres` account must reach it, and a test's tmp_path
    # sits below folders only root may enter.
    pg_root = Path(tempfile.mkdtemp(prefix="berth-chaos-pg-"))
    pg_root.chmod(0o755)
    pg, redis = PrivatePostgres(pg_root), PrivateRedis(work)
    pg.init()
    redis.start()
    database = f"chaos_{uuid.uuid4().hex[:8]}"
    where = ""
    if tablespace is not None:
        _give_to_postgres(tablespace)
        pg.sql("postgres", f"CREATE TABLESPACE chaos LOCATION '{tablespace}'")
        where = " TABLESPACE chaos"
    pg.sql("postgres", f'CREATE DATABASE "{database}"{where}')
    stack = Stack(work=work, pg=pg, redis=redis, database=database, timings=timings or {},
                  host=host, tablespace=tablespace)  # fmt: skip
    try:
        stack.up(nodes=nodes, schedulers=schedulers)
        stack.user_token = stack.token()
        yield stack
    finally:
        stack.stop()
        redis.stop()
        pg.stop("immediate")
        shutil.copy(pg.log, work / "postgres.log")
        shutil.rmtree(pg_root, ignore_errors=True)


def freeze(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGSTOP)


def thaw(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGCONT)


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


class Bridge:
    """A switch in this namespace that namespaces plug into (`Netns(bridge=...)`): several
    hosts on one link, 10.232.N.0/24, each reaching the others by its own address. Ours on
    the link is `address` (.254); N is the first subnet no interface here uses yet."""

    def __init__(self) -> None:
        self.name = f"berthb-{uuid.uuid4().hex[:6]}"
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        free = (n for n in range(1, 255) if f" 10.232.{n}." not in used)
        self.prefix = f"10.232.{next(free)}"
        self.address = f"{self.prefix}.254"

    def __enter__(self) -> Bridge:
        try:
            _ip("link", "add", self.name, "type", "bridge")
            _ip("addr", "add", f"{self.address}/24", "dev", self.name)
            _ip("link", "set", self.name, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class Netns:
    """A network namespace joined to this one by a veth pair: a second host on this machine.
    Alone, its side is `inner` (10.231.N.2) and ours `outer` (10.231.N.1), a link of their
    own; on a `bridge`, its side is `inner` (the bridge's prefix + `.host`) and `outer` is
    ours on the bridge, so namespaces on one bridge reach each other too. `cut()` takes our
    end of the link down (packets are dropped, as on a lost network), `restore()` brings it
    back. Leaving the block removes the link and the namespace; stop the processes in it
    first (`command()`), or they keep the namespace alive unnamed."""

    def __init__(self, n: int = 7, bridge: Bridge | None = None, host: int = 2) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name, self.ours, self.theirs = f"berthc-{tag}", f"bc{tag}a", f"bc{tag}b"
        self.bridge = bridge
        if bridge is None:
            self.outer, self.inner, self.prefix_len = f"10.231.{n}.1", f"10.231.{n}.2", 30
        else:
            self.outer, self.inner = bridge.address, f"{bridge.prefix}.{host}"
            self.prefix_len = 24

    def __enter__(self) -> Netns:
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.ours, "type", "veth", "peer", "name", self.theirs)
            _ip("link", "set", self.theirs, "netns", self.name)
            if self.bridge is None:
                _ip("addr", "add", f"{self.outer}/{self.prefix_len}", "dev", self.ours)
            else:
                _ip("link", "set", self.ours, "master", self.bridge.name)
            _ip("link", "set", self.ours, "up")
            _ip("-n", self.name, "addr", "add", f"{self.inner}/{self.prefix_len}", "dev",
                self.theirs)  # fmt: skip
            _ip("-n", self.name, "link", "set", self.theirs, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.ours], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.ours, "down"], check=True)

    def restore(self) -> None:
        subprocess.run(["ip", "link", "set", self.ours, "up"], check=True)

    def command(self, argv: list[str]) -> list[str]:
        # nsenter enters the network namespace only: `ip netns exec` would remount /sys
        # without its cgroup mounts, and the agent could not enforce a task's limits
        return ["nsenter", f"--net=/run/netns/{self.name}", "--", *argv]


@contextmanager
def small_disk(megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` under /tmp (root only): a disk that fills for real."""
    path = Path(tempfile.mkdtemp(prefix="berth-chaos-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs",
                    str(path)], check=True)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` up to `leave` bytes free with one file (removed to free it again)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(filler, "wb") as handle:
        chunk = b"\0" * (1 << 20)
        try:
            while size > 0:
                handle.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
        except OSError:
            pass  # full: what we wanted
    return filler
