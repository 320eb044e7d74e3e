"""The node agent: runs tasks as real processes and speaks the agent protocol over HTTP.

It never touches the database (it runs on other machines). Each task runs its command from a
script file run by `bash -l` (`/bin/sh` on a node without bash) in its own process group, in
its work dir, with an environment built from scratch and, when the agent is root, as an
unprivileged account (scheduler/agent/isolation.py), in a cgroup of its own with a private /tmp
(scheduler/agent/fence.py). Its output goes to a file that the agent ships to the server by
byte offset, and a small wrapper writes the exit code to a file. Both files live in the agent's
0700 state dir: the agent opens them and hands the task only file descriptors, so a task
running as another account can write its output and exit code but never read the agent's state.
Because both live on disk and the agent keeps a 0600 state file (its node token and its tasks),
an agent that restarts re-adopts the processes that still run, keeps shipping their output and
still learns their exit codes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from scheduler.agent.cleanup import (
    DEFAULT_KEEP_WORK_DIRS,
    SWEEP_SECONDS,
    free_shipped,
    remove_task_files,
    sweep_work_dirs,
)
from scheduler.agent.client import PROTOCOL, Backoff, Http, ServerError, Unavailable
from scheduler.agent.fence import OUT_OF_MEMORY, Fence, oom_message, start_gated, usage_report
from scheduler.agent.gpumodes import MPS, NodeSharing, TaskGpus, fake_mig_instances, mig_instances
from scheduler.agent.gpus import FAKE_MEMORY, GpuSampler, fake_level, task_utilization
from scheduler.agent.isolation import (
    DEFAULT_TASK_UIDS,
    DEFAULT_TASK_USER,
    TaskAccounts,
    build_env,
    login_bash,
    private_dir,
    private_tmp_argv,
    private_tmp_tools,
    shell_script,
    spawn_kwargs,
    task_dir_name,
    task_tmp,
    task_workdir,
    unreachable_ancestor,
    work_base,
    write_script,
)
from scheduler.agent.partition import PartitionGuard
from scheduler.agent.pressure import DEFAULT_MIN_FREE, PressureWatch
from scheduler.agent.session import FORGET_ENDED_SECONDS as FORGET_ENDED_SECONDS
from scheduler.agent.session import Session
from scheduler.agent.terminal import TaskContext, Terminals, TerminalSession
from scheduler.agent.wire import (
    InlineOutput,
    KillOrder,
    LogChunk,
    Registration,
    TaskReport,
    TaskState,
    TerminalOrder,
)

__all__ = ["Agent", "RunningTask", "ServerError", "Unavailable", "parse_labels"]
log = logging.getLogger("berth.agent")
VERSION = f"berth-agent/{PROTOCOL}"
# $@ is the shell, its flags and the script's path (isolation.shell_script): no job text. The
# wrapper's stdin is the exit-code file, opened for writing by the agent (a task running as
# another account could not open it in the agent's state dir): the wrapper moves it to fd 3,
# gives the command /dev/null as stdin and no fd 3, and writes the command's exit code to it.
# The wrapper outlives a SIGTERM (a handler, unlike an ignored signal, is not inherited: the
# command still gets SIGTERM) so that the command has its grace period and its exit code is
# recorded. Its stdout starts as a pipe's read end (its stderr is the output file): the
# wrapper waits there until the agent has put it in the task's cgroup, so that nothing it
# starts can be outside it, then makes the output file its stdout too.
WRAPPER = (
    'read _ <&1 || exit 125; exec 1>&2; trap ":" TERM; exec 3>&0 </dev/null;'
    ' "$@" 3>&-; code=$?; echo "$code" >&3; exit "$code"'
)
LOG_CHUNK = 60 * 1024  # at most; the server may ask for smaller chunks when it registers us
SHIP_PER_STEP = 16  # chunks per task per turn, so a chatty task never delays reports
POLL_SECONDS = 0.05  # how often processes are checked: an end is reported within this
SHIP_SECONDS = 1.0  # running tasks' output is shipped this often (an ended task's at once)
AWAIT_OUTPUT_SECONDS = 0.5  # a report the server answered "awaiting output" is re-sent after
ORDERS_ACK_SECONDS = 5.0


def discover_resources() -> tuple[int, int]:
    """Cores (as millicores) this process may use, and the machine's memory in bytes."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    memory = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    except OSError:
        memory = 0
    return cores * 1000, memory


def discover_gpus(
    fake: int, name: str, fake_mig: dict[int, list[str]] | None = None
) -> list[dict[str, Any]]:
    """GPUs through NVML when present; otherwise `fake` fake devices (those in `fake_mig`
    with made-up MIG instances of those profiles)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            gpus = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                model = pynvml.nvmlDeviceGetName(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
                gpus.append({
                    "index": index,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    "model": model.decode() if isinstance(model, bytes) else str(model),
                    "memory": int(memory),
                    "healthy": True,
                })  # fmt: skip
                instances = mig_instances(pynvml, handle)  # read only (agent/gpumodes.py)
                if instances:
                    gpus[-1]["mig"] = instances
            if gpus:
                return gpus
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library, no device: fall back
        pass
    devices: list[dict[str, Any]] = [
        {"index": i, "uuid": f"fake-{name}-{i}", "model": "fake", "memory": FAKE_MEMORY,
         "healthy": True}
        for i in range(fake)
    ]  # fmt: skip
    for index, profiles in (fake_mig or {}).items():
        if index < fake:
            devices[index]["mig"] = fake_mig_instances(name, index, profiles)
    return devices


def parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"label {part!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


@dataclass
class RunningTask:
    id: int
    attempt: int
    pid: int
    dir: str  # in the agent's state dir: output.log and exit_code
    workdir: str = ""  # the task's own work dir (its cwd)
    shipped: int = 0  # bytes of output the server has
    exit_code: int | None = None
    state: str = TaskState.RUNNING  # Running | Succeeded | Failed | Killed | Lost (cut off)
    kill_at: float | None = None  # when SIGKILL follows the SIGTERM
    killed: bool = False
    cut_off: bool = False  # stopped because the agent was cut off from the server (partition.py)
    message: str = ""
    dropped: bool = False  # the server keeps no more of this attempt's output
    started: str = ""  # the process's start time (/proc), to tell it from a reused pid
    devices: list[int] = field(default_factory=list)  # GPU indices the server gave it
    started_at: float = 0.0  # wall-clock (Unix) time the process started; 0: it never did
    ended_at: float = 0.0  # wall-clock time the process was seen to end
    cgroup: str = ""  # its cgroup's name under the agent's (scheduler/agent/fence.py)
    memory: int = 0  # bytes it asked for (its limit where enforced)
    reason: str = ""  # why it ended, when the exit code does not say (OutOfMemory)
    usage: dict[str, Any] | None = None  # what its cgroup says it used, once it ended
    gpu_util: list[float] = field(default_factory=lambda: [0.0, 0.0])  # NVML: sum, samples
    fake_level: int | None = None  # what its fake GPUs report (gpus.FAKE_LEVEL_ENV), if fixed
    gpu_mode: str = ""  # the GPU sharing mode its share runs under (agent/gpumodes.py)
    app_port: int | None = None  # the port picked for the job's app ($BERTH_APP_PORT), if any
    proc: Any = field(default=None, repr=False, compare=False)

    @property
    def output(self) -> Path:
        return Path(self.dir) / "output.log"

    @property
    def exit_file(self) -> Path:
        return Path(self.dir) / "exit_code"


class Agent(Session):
    """One machine's agent. `run(stop)` loops until `stop` is set.

    Two threads talk to the server. The main loop checks the processes every POLL_SECONDS,
    ships their output and sends a full-state report whenever something changed (a task
    started, ended, or could not start), one report at a time. The lease thread keeps one
    lease request open; the server holds it until it has orders for this node (or the lease
    is up) and the main loop carries the orders out. Back-pressure (429/503, Retry-After) and
    an unreachable server only delay the next request: the state is kept and reported whole.
    """

    homes = True  # whether a task's work dir can be its HOME (set by prepare())
    tmp_tools: tuple[str, str] | None = None  # for a private /tmp (set by prepare())
    sweep_at = 0.0  # when work dirs are next looked at

    def __init__(
        self,
        server: str,
        join_token: str,
        name: str | None = None,
        labels: str | dict[str, str] = "",
        fake_gpus: int = 0,
        work_dir: Path | str = "berth-agent",
        state_dir: Path | str | None = None,
        kill_on_exit: bool = False,
        timeout: float = 10.0,
        task_user: str = DEFAULT_TASK_USER,
        min_free_disk: int = DEFAULT_MIN_FREE,
        fence: Fence | None = None,
        task_uids: tuple[int, int] | None = DEFAULT_TASK_UIDS,
        keep_work_dirs: float = DEFAULT_KEEP_WORK_DIRS,
        gpu_sharing: tuple[str, ...] | None = None,
        mps_control: str | None = None,
        fake_mig: dict[int, list[str]] | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.join_token = join_token
        self.name = name or socket.gethostname().split(".")[0].lower()
        self.labels = parse_labels(labels) if isinstance(labels, str) else dict(labels)
        self.fake_gpus, self.fake_mig = fake_gpus, fake_mig or {}
        self.work_dir = Path(work_dir)
        self.state_dir = Path(state_dir) if state_dir else self.work_dir / "state"
        self.state_file = self.state_dir / "state.json"
        self.task_uids, self.keep_work_dirs = task_uids, keep_work_dirs  # see command.py
        self.accounts: TaskAccounts | None = None  # set by prepare()
        self.bash: str | None = None  # bash's path ("" if none), found at the first start
        self.task_user, self.kill_on_exit = task_user, kill_on_exit
        self._init_protocol(timeout)
        self.tasks: dict[int, RunningTask] = {}
        self.lock = threading.RLock()  # self.tasks, between the main loop and the lease thread
        self.wake = threading.Event()
        self.inbox: queue.Queue[tuple[dict[str, Any], threading.Event]] = queue.Queue()
        self.dirty = True  # a report is due (always one first: the server learns our state)
        self.retry_at = 0.0  # no request of the main loop before this (back-pressure)
        self.report_at = 0.0  # no report before this (waiting for output to be taken)
        self.ship_running_at = 0.0  # running tasks' output goes out at most every SHIP_SECONDS
        self.ended: dict[tuple[int, int], float] = {}  # attempts over: a late start is ignored
        self.reregister = False
        self.gpus = GpuSampler([], fake=True)  # the registered GPUs (set by register())
        self.fence = fence or Fence(base_name=f"berth-{self.name}")
        # When the server last renewed our lease (set by register()): partition.py.
        self.partition = PartitionGuard()
        self.pressure = PressureWatch([self.work_dir, self.state_dir], min_free_disk)
        self.sharing = NodeSharing(gpu_sharing, mps_control, self.work_dir / "mps",
                                   self.state_dir / "mps")  # fmt: skip

    def _init_protocol(self, timeout: float) -> None:
        """What the agent knows of the server before register() tells it more."""
        self.timeout = timeout
        self.token = ""
        self.lease = 10.0
        self.grace = 10.0
        self.log_chunk = LOG_CHUNK
        self.inline_bytes = 0  # output up to this size rides in the final report (register())
        self.http = Http(self.server, timeout)
        self.lease_http = Http(self.server, timeout)
        self.backoff = Backoff()
        self.terminals = Terminals()  # terminal sessions open with the server (terminal.py)

    # --- HTTP ------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        return self.http.post(path, body, auth)

    # --- lifecycle -------------------------------------------------------------------

    def register(self) -> None:
        """Register (again) as this node. A node token kept from before is this node's proof
        of identity (the join token registers new names only); when the server no longer
        knows it (the node was deleted, or staff reset its token), join as a newcomer."""
        cpu, memory = discover_resources()
        devices = discover_gpus(self.fake_gpus, self.name, self.fake_mig)
        self.gpus.close()
        self.gpus = GpuSampler(devices, fake=any(d["model"] == "fake" for d in devices))
        modes = self.sharing.configure(devices)
        body = Registration(self.name, cpu, memory, self.labels, devices, socket.gethostname(),
                            VERSION, self.fence.describe(), modes).to_json()  # fmt: skip
        answer: dict[str, Any] | None = None
        sent = self.partition.clock()
        if self.token:
            try:
                answer = self._post("register/", body, f"Node {self.token}")
            except ServerError as exc:
                if exc.status != 401:
                    raise
                log.warning("the server no longer knows our node token; joining as a new node")
                self.token = ""
        if answer is None:
            answer = self._post("register/", body, f"Bearer {self.join_token}")
        registered = self.registered(answer, LOG_CHUNK)
        self.partition.timeout = registered.heartbeat_timeout
        self.partition.lease, self.partition.grace = self.lease, self.grace
        self.partition.heard(sent)
        if self.partition.timeout and not self.partition.enabled:
            log.warning(
                "the server's node lease (%gs) is too short for this agent to stop its"
                " tasks safely when cut off from it: it will not stop them then",
                self.partition.timeout,
            )
        self.dirty = True
        self._save()
        log.info("registered as node %s", self.name)

    def _join(self) -> None:
        """Register (refreshing labels and devices); if the join token is refused but a node
        token survives from before a restart, go on with that one."""
        try:
            self.register()
        except ServerError as exc:
            if exc.status in (401, 403) and self.token:
                log.warning("registration refused (%s); using the saved node token", exc)
                return
            raise

    def run(self, stop: threading.Event) -> None:
        """Run until `stop` is set. Safe to run in a thread (no signal handlers here)."""
        self.prepare()
        self._load()
        joined = False
        leases: threading.Thread | None = None
        try:
            while not stop.is_set():
                try:
                    if not joined or self.reregister:
                        if self.reregister:
                            self.token, self.reregister = "", False
                        self._join()
                        joined = True
                        self.backoff.reset()
                    if leases is None:
                        leases = threading.Thread(
                            target=self._lease_loop, args=(stop,), name="agent-lease", daemon=True
                        )
                        leases.start()
                        threading.Thread(
                            target=self._partition_watch, args=(stop,), daemon=True
                        ).start()
                    self.step()
                    self.wake.wait(POLL_SECONDS)
                    self.wake.clear()
                    continue
                except ServerError as exc:
                    if exc.status == 401 and joined:
                        log.warning("the server does not know our node token; registering again")
                        self.token, joined = "", False
                    else:
                        log.warning("server refused a request: %s", exc)
                    wait = self.backoff.delay()
                except Unavailable as exc:
                    wait = self.backoff.delay(exc.retry_after)
                    log.warning("server unavailable (%s); retrying in %.1fs", exc, wait)
                except Exception:  # an agent keeps its tasks and goes on, whatever happened
                    wait = self.backoff.delay()
                    log.exception("agent step failed; retrying in %.1fs", wait)
                stop.wait(self._cut_off_wait(wait))
        finally:
            self._shut_down(leases)

    def _shut_down(self, leases: threading.Thread | None) -> None:
        """The agent stops: end the held lease, stop the tasks if asked to, save the state,
        and stop the MPS daemons no running task still uses (the next agent adopts those)."""
        self.lease_http.abort()  # end the held lease request now
        if leases is not None:
            leases.join(timeout=5)
        if self.kill_on_exit:
            self._kill_all()
        self._save()
        self.fence.close()
        self.gpus.close()
        with self.lock:
            in_use = {i for t in self.tasks.values() if t.state == TaskState.RUNNING
                      and t.gpu_mode == MPS for i in t.devices}  # fmt: skip
        self.sharing.close(in_use)

    def _kill_all(self) -> None:
        """--kill-on-exit: stop every task (SIGTERM, SIGKILL after the grace) and tell the
        server, so that their devices are free at once."""
        for task in list(self.tasks.values()):
            self.kill(task, self.grace)
        deadline = time.monotonic() + self.grace + 2
        while time.monotonic() < deadline:
            self._poll()
            if all(t.state != TaskState.RUNNING for t in self.tasks.values()):
                break
            time.sleep(POLL_SECONDS)
        if self.token:
            try:
                self.retry_at = self.report_at = 0.0
                self.step()
            except Exception as exc:  # the server will find out through its timeout
                log.warning("could not report the killed tasks: %s", exc)

    def step(self) -> None:
        """One turn of the main loop: carry out orders, check processes, ship output, and
        report if anything changed. Back-pressure only postpones what is due."""
        self._take_orders()
        self._poll()
        self._stop_if_cut_off()
        self.sharing.check()  # an MPS daemon that died is started again
        self._check_disk()
        now = time.monotonic()
        if now >= self.sweep_at:
            self.sweep_at = now + min(SWEEP_SECONDS, self.keep_work_dirs / 10)
            with self.lock:
                in_use = [t.workdir for t in self.tasks.values() if t.workdir]
            sweep_work_dirs(self.work_dir, self.keep_work_dirs, in_use)
        if now < self.retry_at:
            return
        try:
            self._ship_logs(running=now >= self.ship_running_at)
            if now >= self.ship_running_at:
                self.ship_running_at = now + SHIP_SECONDS
            if self.dirty and now >= self.report_at:
                self._report()
        except Unavailable as exc:
            wait = self.backoff.delay(exc.retry_after)
            self.retry_at = time.monotonic() + wait
            log.warning("server unavailable (%s); next try in %.1fs", exc, wait)
            return
        self.backoff.reset()

    def _task_reports(self, inline: bool = False) -> list[TaskReport]:
        """Every task we know, for a report or a lease; with `inline` (a report), the rest of
        an ended task's output when it is short."""
        with self.lock:
            return [
                TaskReport(
                    t.id,
                    t.attempt,
                    TaskState(t.state),
                    t.exit_code,
                    t.message,
                    t.shipped if t.dropped else _size(t.output),
                    t.killed,
                    t.started_at or None,
                    t.ended_at or None,  # the process's own times
                    self._inline_output(t) if inline else None,
                    t.reason,
                    t.usage or {},
                    app_port=t.app_port,
                    gpu_mode=t.gpu_mode,
                )  # fmt: skip
                for t in self.tasks.values()
            ]

    def _task_list(self, inline: bool = False) -> list[dict[str, Any]]:
        """`_task_reports` as they travel."""
        return [report.to_json() for report in self._task_reports(inline)]

    def _inline_output(self, task: RunningTask) -> InlineOutput | None:
        """The rest of an ended task's output (`offset`, `data`) when it is short enough to
        travel in the final report instead of a log upload of its own."""
        if task.state == TaskState.RUNNING or task.dropped or self.inline_bytes <= 0:
            return None
        size = _size(task.output)
        if not 0 < size - task.shipped <= self.inline_bytes:
            return None
        try:
            with task.output.open("rb") as handle:
                handle.seek(task.shipped)
                text = handle.read(size - task.shipped).decode(errors="replace")
        except OSError:
            return None
        # The server refuses NUL in a report (only a log upload's `data` may hold it, which
        # it stores as U+FFFD): do the same here.
        text = text.replace("\x00", "\ufffd")
        if len(text.encode()) > self.inline_bytes:  # undecodable bytes grow when replaced
            return None
        return InlineOutput(task.shipped, text)

    def _report(self) -> None:
        self.dirty = False  # a change from here on needs a report of its own
        reported = self._task_reports(inline=True)
        sent = self.partition.clock()
        try:
            answer = self._post(
                "report/",
                {"tasks": [r.to_json() for r in reported], "usage": self._usage(len(reported))},
                f"Node {self.token}",
            )
        except BaseException:
            self.dirty = True
            raise
        self.partition.heard(sent)
        self.renewed(answer)
        now = time.monotonic()
        with self.lock:
            taken, short = self.settle(reported, answer, now)
            for task in taken:  # the server has its end and its output
                remove_task_files(Path(task.dir))
            for task, awaiting in short:
                # The server lacks some output: ship from what it holds, report again.
                task.shipped = min(task.shipped, awaiting.have)
                self.dirty = True
                self.report_at = now + AWAIT_OUTPUT_SECONDS
        self._apply_orders(answer)
        self._save()

    def _usage(self, tasks: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"load": os.getloadavg()[0], "tasks": tasks}
        if self.pressure.now:
            usage["pressure"] = self.pressure.now
        return usage

    # --- orders ----------------------------------------------------------------------

    def _lease_loop(self, stop: threading.Event) -> None:
        """Keep a lease request open; hand its orders to the main loop."""
        backoff = Backoff()
        while not stop.is_set():
            token = self.token
            if not token:
                stop.wait(POLL_SECONDS)
                continue
            sent = self.partition.clock()
            body = self.lease_body()
            answer = self.hold_lease(self.lease_http, body, self.timeout, stop, backoff,
                                     self._lease_refused)  # fmt: skip
            if answer is None:
                continue
            self.partition.heard(sent)
            if answer.get("start") or answer.get("kill") or answer.get("terminals"):
                done = threading.Event()
                self.inbox.put((answer, done))
                self.wake.set()
                # The next lease must list what these orders started, or it would get them
                # again at once.
                done.wait(ORDERS_ACK_SECONDS)

    def lease_body(self) -> dict[str, Any]:
        """Our tasks, and each GPU's utilisation and memory now (the server keeps a history:
        a sample rides on every renewal, so it costs no request of its own); each running
        task holding GPUs says their mean utilisation in that sample (`gpu_utilization`: the
        server flags GPUs held idle), so that costs no request either."""
        with self.lock:
            running = [t for t in self.tasks.values() if t.state == TaskState.RUNNING and t.devices]
        busy = {i for t in running for i in t.devices}
        levels = {i: t.fake_level for t in running if t.fake_level is not None for i in t.devices}
        samples = self.gpus.sample(busy, levels)
        if not self.gpus.fake:  # real GPUs: each task's own, for its efficiency at the end
            add_gpu_samples(list(self.tasks.values()), samples)
        recent = {t.id: task_utilization(t.devices, samples) for t in running}
        tasks = self._task_reports()
        for item in tasks:
            if item.state == TaskState.RUNNING and item.id in recent:
                value = recent[item.id]  # None: its GPUs could not be read (said as null)
                item.gpu_utilization = None if value is None else round(value, 1)
                item.gpu_unmeasured = value is None
        return {"tasks": [t.to_json() for t in tasks], "usage": {"gpus": samples},
                "terminals": self.terminals.ids()}  # fmt: skip

    def _lease_refused(self, exc: ServerError, token: str) -> None:
        if exc.status == 401 and token == self.token:
            self.reregister = True  # the main loop registers again
        log.warning("lease refused: %s", exc)

    def _take_orders(self) -> None:
        while True:
            try:
                answer, done = self.inbox.get_nowait()
            except queue.Empty:
                return
            try:
                self._apply_orders(answer, by_lease=True)
            finally:
                done.set()

    def _apply_orders(self, answer: dict[str, Any], by_lease: bool = False) -> None:
        """Carry out orders. A task started on a lease's orders needs no report: the next
        lease, sent once these are carried out, lists it Running and so confirms its start
        (protocol 3). A start from a report's answer, or one that failed, is reported."""
        with self.lock:
            for kill in answer.get("kill", []):
                order = KillOrder.from_json(kill)
                key = (order.id, order.attempt)
                target = self.tasks.get(key[0])
                if target is not None and target.attempt == key[1]:
                    grace = order.grace_seconds
                    self.kill(target, self.grace if grace is None else grace)
                elif self.is_new(*key):
                    # Stopped before it reached us: say it never ran, and never start it.
                    self.tasks[key[0]] = RunningTask(
                        key[0], key[1], 0, str(self.work_dir / f"task-{key[0]}-{key[1]}"),
                        state=TaskState.KILLED, message="stopped before it started", killed=True,
                    )  # fmt: skip
                    self.dirty = True
            for order in answer.get("start", []):
                key = (int(order["id"]), int(order["attempt"]))
                if not self.is_new(*key):
                    continue  # a start repeated by a request that crossed our report
                self.start(order)
                started = self.tasks.get(key[0])
                if not by_lease or started is None or started.state != TaskState.RUNNING:
                    self.dirty = True
            for item in answer.get("terminals", []):
                self._open_terminal(TerminalOrder.from_json(item))

    def _open_terminal(self, order: TerminalOrder) -> None:
        """A terminal session in a running task of ours (under the lock): its own threads
        and websocket; one that cannot open says why on that socket."""
        task = self.tasks.get(order.task)
        context, problem = None, ""
        if task is None or task.attempt != order.attempt or task.state != TaskState.RUNNING:
            problem = f"task {order.task} (attempt {order.attempt}) does not run on this node"
        elif task.pid <= 0 or not task.workdir:
            problem = f"task {order.task} has no process to join"
        else:
            context = TaskContext(task.pid, task.cgroup, task.workdir, self.tmp_tools is not None)
        session = TerminalSession(self.server, self.token, order, context, problem,
                                  self.fence.add)  # fmt: skip
        self.terminals.open(session)

    # --- processes -------------------------------------------------------------------

    def prepare(self) -> TaskAccounts:
        """Check the task account and make the directories (once). Raises ValueError when the
        configured task account is missing or is root, or a directory is someone else's."""
        if self.accounts is not None:
            return self.accounts
        private_dir(self.state_dir)
        accounts = TaskAccounts(self.task_user, self.task_uids, self.state_dir)
        work_base(self.work_dir, accounts.switching)
        log.info("%s", accounts.describe())
        if accounts.switching:
            blocked = unreachable_ancestor(self.work_dir, accounts.default)
            if blocked is not None:
                log.warning(
                    "%s cannot pass through %s on the way to the work dir %s: its tasks start"
                    " there but cannot use the dir's absolute path; choose a --work-dir"
                    " under a path every account can pass through (e.g. /var/lib/berth)",
                    accounts.default.name, blocked, self.work_dir,
                )  # fmt: skip
            # A uid from the range has no home: its work dir is, when it can reach it.
            self.homes = blocked is None
        self.fence.setup()
        self.tmp_tools = private_tmp_tools()
        if self.tmp_tools is None:
            log.warning("no private /tmp for tasks (not root, or no unshare/setpriv here):"
                        " each gets TMPDIR in its work dir instead")  # fmt: skip
        self.accounts = accounts
        return accounts

    def start(self, order: dict[str, Any]) -> None:
        task_id, attempt = int(order["id"]), int(order["attempt"])
        current = self.tasks.get(task_id)
        if current is not None and current.attempt == attempt:
            return  # already running: a start message repeated until we report it
        directory = self.state_dir / f"task-{task_id}-{attempt}"
        workdir = self.work_dir / task_dir_name(task_id, attempt)
        devices = _indices(order.get("devices"))
        limits = self.fence.limits(order, devices)
        group = ""
        gpus = TaskGpus({})
        try:
            accounts = self.prepare()
            if self.fence.refuses:
                raise ValueError(self.fence.problem)
            if self._disk_full():
                raise ValueError(self.pressure.now)
            gpus = self.sharing.task(order, devices, self.fence.gpu_nodes)
            limits = replace(limits, devices=limits.devices + gpus.device_nodes)
            start_env = {**(order.get("env") or {}), **gpus.env}  # the agent's word is last
            account = accounts.for_owner(order.get("owner"))
            env = build_env(start_env, account, workdir if self.homes else None)
            app_port = with_app_port(order, env)
            shell, script = self._shell(str(order["command"]), start_env)
            private_dir(directory)
            task_workdir(workdir, account, accounts.switching)
            path = write_script(workdir, script, account, accounts.switching)
            group = self.fence.create(f"task-{task_id}-{attempt}", limits)
            # Relative to its work dir (its cwd): the way there may be closed to its account.
            argv = [*shell, f"./{path.name}"]
            if self.tmp_tools is None:
                env["TMPDIR"] = str(task_tmp(workdir, account, accounts.switching))
            proc = self._spawn(directory, workdir, env, argv, account, group, limits.memory)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # Report it as failed rather than be sent the same start message forever.
            log.error("could not start task %s: %s", task_id, exc)
            self.fence.end(group)
            self.tasks[task_id] = RunningTask(
                task_id, attempt, 0, str(directory), exit_code=127, state=TaskState.FAILED,
                message=f"the agent could not start it: {exc}",
            )  # fmt: skip
            return
        self.tasks[task_id] = RunningTask(
            task_id, attempt, proc.pid, str(directory), workdir=str(workdir), proc=proc,
            started=_start_time(proc.pid), devices=devices, started_at=time.time(),
            cgroup=group, memory=limits.memory, fake_level=fake_level(order.get("env")),
            gpu_mode=gpus.mode, app_port=app_port,
        )  # fmt: skip
        log.info("started task %s (attempt %s) as pid %s, user %s",
                 task_id, attempt, proc.pid, account.name)  # fmt: skip

    def _check_disk(self, force: bool = False) -> None:
        """Look at the disk's free space if due (`force`: now); a change is reported at
        once: the server places tasks on us by it."""
        if self.pressure.check(force):
            log.warning("disk pressure: %s", self.pressure.now or "cleared")
            self.dirty = True

    def _disk_full(self) -> bool:
        """Is the disk too full for a new task now? Looked at afresh: the once-a-second check
        of the main loop may not have seen it fill yet."""
        self._check_disk(force=True)
        return bool(self.pressure.now)

    def _spawn(self, directory: Path, workdir: Path, env: dict[str, str], args: list[str],
               account: Any, group: str, memory: int) -> subprocess.Popen[bytes]:  # fmt: skip
        """Start the wrapper; it runs the command once it is in the task's cgroup `group`.
        With a private /tmp, unshare and setpriv start it as the task's account; else Popen
        switches to that account itself."""
        switching = self.accounts is not None and self.accounts.switching
        prefix: list[str] = []
        if self.tmp_tools is not None:
            prefix = private_tmp_argv(self.tmp_tools, account, memory)

        def start(gate: int) -> subprocess.Popen[bytes]:
            with (
                open(directory / "output.log", "ab") as output,
                open(directory / "exit_code", "wb") as exit_file,
            ):
                return subprocess.Popen(
                    [*prefix, "/bin/sh", "-c", WRAPPER, "berth-task", *args],  # no job text
                    cwd=workdir,
                    env=env,
                    stdin=exit_file,  # the wrapper's, see WRAPPER; the command gets /dev/null
                    stdout=gate,  # until it may go on; then the output file, as its stderr
                    stderr=output,
                    start_new_session=True,  # its own process group, killed as a whole
                    **spawn_kwargs(account, switching and not prefix),
                )

        return start_gated(start, lambda pid: self.fence.add(group, pid))

    def _shell(self, command: str, start_env: dict[str, Any]) -> tuple[list[str], str]:
        """The shell with its flags, and the script that runs `command`."""
        if self.bash is None:
            self.bash = login_bash() or ""
        return shell_script(command, start_env, self.bash or None)

    def _partition_watch(self, stop: threading.Event) -> None:
        """The partition check on a thread of its own: the main loop may be held up to the
        HTTP timeout by a request to a server whose packets are dropped, longer than the
        partition grace allows."""
        while not stop.wait(POLL_SECONDS):
            try:
                self._stop_if_cut_off()
            except Exception:  # noqa: BLE001 - logged; the next turn tries again
                log.exception("partition check failed")

    def _stop_if_cut_off(self) -> None:
        """Cut off from the server for too long: stop every task before the server may give
        it up and run it elsewhere (partition.py): SIGTERM, and SIGKILL at the deadline even if
        the main loop is stuck. While they run, renew the lease with a report once a lease
        has passed without one."""
        with self.lock:
            running = [t for t in self.tasks.values() if t.state == TaskState.RUNNING]
            if not running:
                return
            if self.partition.renewal_due():
                self.dirty = True
            if not self.partition.due():
                return
            now = time.monotonic()
            deadline = now + self.partition.grace_left()
            stopping = [t for t in running if not t.cut_off and not t.killed]
            if stopping:
                log.warning("%s: stopping %d tasks", self.partition.why(), len(stopping))
            for task in stopping:
                task.cut_off, task.message = True, self.partition.why()
                self.kill(task, self.partition.grace_left())
            for task in running:  # on the server's order too: SIGKILL by the deadline
                if task.kill_at is not None and task.kill_at > deadline:
                    task.kill_at = deadline
                if task.kill_at is not None and now >= task.kill_at:
                    self._signal(task, signal.SIGKILL)
                    self.fence.kill_all(task.cgroup)  # daemons of its own session too
                    task.kill_at = None

    def _cut_off_wait(self, wait: float) -> float:
        """A backoff never postpones the partition check: with tasks running, look again
        within 0.5 s."""
        self._poll()
        self._stop_if_cut_off()
        with self.lock:
            running = any(t.state == TaskState.RUNNING for t in self.tasks.values())
        return min(wait, 0.5) if running else wait

    def kill(self, task: RunningTask, grace: float) -> None:
        if task.state != TaskState.RUNNING or task.killed:
            return
        task.killed = True
        task.kill_at = time.monotonic() + grace
        self._signal(task, signal.SIGTERM)
        self.fence.signal_all(task.cgroup, signal.SIGTERM)  # its other sessions too

    def _signal(self, task: RunningTask, sig: int) -> None:
        if task.pid <= 0:
            return
        try:
            os.killpg(task.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            log.warning("not allowed to signal task %s (pid %s)", task.id, task.pid)

    def _poll(self) -> None:
        for task in self.tasks.values():
            if task.state != TaskState.RUNNING:
                continue
            if task.cgroup and not task.reason and self.fence.out_of_memory(task.cgroup):
                # As memory.oom.group does on v2: the task dies whole, and says why.
                task.reason = OUT_OF_MEMORY
                self.fence.kill_all(task.cgroup)
            code = self._exit_code(task)
            if code is None:
                if task.kill_at is not None and time.monotonic() >= task.kill_at:
                    self._signal(task, signal.SIGKILL)
                    self.fence.kill_all(task.cgroup)
                    task.kill_at = None
                continue
            self._ended(task, code)

    def _ended(self, task: RunningTask, code: int) -> None:
        task.exit_code = code
        task.ended_at = time.time() if task.proc is not None else _ended_at(task)
        self.dirty = True  # an end goes to the server at once
        if task.cut_off:
            task.state = TaskState.LOST  # task.message says why (_stop_if_cut_off)
        elif task.killed:
            task.state = TaskState.KILLED
            task.message = "stopped on the server's request"
        else:
            task.state = TaskState.SUCCEEDED if code == 0 else TaskState.FAILED
        # Nothing of the task may outlive it (a child left in the background, a daemon).
        self._signal(task, signal.SIGKILL)
        ended = self.fence.end(task.cgroup)
        if ended is None:
            return
        task.usage = usage_report(ended.usage)
        if task.usage is not None and task.gpu_util[1]:
            task.usage["gpu_utilization"] = task.gpu_util[0] / task.gpu_util[1]
        if ended.out_of_memory and not task.killed:
            task.state, task.reason = TaskState.FAILED, OUT_OF_MEMORY
            task.message = oom_message(ended.usage, task.memory)
        if ended.leftovers:
            log.info("task %s left %s processes behind: killed", task.id, ended.leftovers)

    def _exit_code(self, task: RunningTask) -> int | None:
        if task.proc is not None:
            code = task.proc.poll()
            if code is None:
                return None
            return int(code) if code >= 0 else 128 - int(code)
        # Adopted after a restart: not our child; the wrapper's exit file tells.
        if _alive(task.pid) and (not task.started or _start_time(task.pid) == task.started):
            return None
        try:
            return int(task.exit_file.read_text().strip())
        except (OSError, ValueError):
            task.message = "ended while the agent was down; exit code unknown"
            return 137 if task.killed else -1

    def _ship_logs(self, running: bool = True) -> None:
        """Ship new output: an ended task's at once (before its final report), a running
        task's when `running`."""
        with self.lock:
            tasks = list(self.tasks.values())
        for task in tasks:
            if task.state == TaskState.RUNNING and not running:
                continue
            if self._inline_output(task) is not None:
                continue  # short: it travels in the final report
            try:
                self._ship(task)
            except ServerError as exc:
                if exc.status >= 500 or exc.status == 401:
                    raise
                # The server will never take this output (the task moved on, or it refuses
                # the chunk): skip it rather than block the reports behind it. The final
                # report then counts only what the server took.
                log.warning("dropping the output of task %s: %s", task.id, exc)
                task.dropped = True

    def _ship(self, task: RunningTask) -> None:
        size = _size(task.output)
        if task.dropped:  # the server keeps no more of it: nor does our copy
            free_shipped(task.output, size)
            return
        for _ in range(SHIP_PER_STEP):
            if task.shipped >= size:
                return
            with task.output.open("rb") as handle:
                handle.seek(task.shipped)
                chunk = handle.read(min(self.log_chunk, size - task.shipped))
            if not chunk:
                return
            if task.state == TaskState.RUNNING or len(chunk) == self.log_chunk:
                # Never split a character between two chunks (the rest may still be written).
                chunk = _whole_utf8(chunk)
            text = chunk.decode(errors="replace")
            while len(text.encode()) > self.log_chunk:  # undecodable bytes grow when replaced
                chunk = chunk[: len(chunk) // 2]
                text = chunk.decode(errors="replace")
            if not chunk:
                return
            answer = self._post(
                f"tasks/{task.id}/log/",
                LogChunk(task.attempt, task.shipped, text).to_json(),
                f"Node {self.token}",
            )
            task.shipped += len(chunk)
            if answer.get("dropped"):  # over the server's cap: the rest would be thrown away
                task.dropped = True
                task.shipped = size
            free_shipped(task.output, task.shipped)
            if task.dropped:
                return

    # --- state file ------------------------------------------------------------------

    def _save(self) -> None:
        """Write the state file atomically, 0600 (it holds the node token)."""
        self.state_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = {
            "name": self.name,
            "token": self.token,
            "server": self.server,
            "tasks": [
                {f.name: getattr(t, f.name) for f in fields(t) if f.name != "proc"}
                for t in self.tasks.values()
            ],
        }
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            os.fchmod(fd, 0o600)  # a leftover tmp file keeps its old mode through O_CREAT
            handle.write(json.dumps(data))
        tmp.replace(self.state_file)

    def _load(self) -> None:
        self._read_state()
        # A task's cgroup outlives an agent that stops: those of running tasks are theirs
        # again; any other (its task ended or was forgotten meanwhile) is killed and removed.
        live = {t.cgroup for t in self.tasks.values() if t.state == TaskState.RUNNING and t.cgroup}
        for name in self.fence.reap(live):
            log.info("killed what was left of %s in its cgroup", name)

    def _read_state(self) -> None:
        legacy = self.work_dir / "state.json"  # where agents before the state dir kept it
        if not self.state_file.exists() and legacy.is_file():
            # Keep the node token across the upgrade (the join token no longer re-registers a
            # taken name), and take it out of the tasks' reach.
            legacy.chmod(0o600)
            legacy.replace(self.state_file)
            log.info("moved the state file %s into the state dir %s", legacy, self.state_dir)
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        if data.get("name") != self.name or data.get("server") != self.server:
            return
        self.token = data.get("token", "")
        known = {f.name for f in fields(RunningTask)} - {"kill_at", "proc"}
        for item in data.get("tasks", []):
            task = RunningTask(**{k: v for k, v in item.items() if k in known})
            self.tasks[task.id] = task
            if task.state == TaskState.RUNNING:
                log.info(
                    "re-adopted task %s (pid %s) after a restart: it is no longer our child, so"
                    " its exit code comes from its exit file; its output file is still shipped",
                    task.id, task.pid,
                )  # fmt: skip


def with_app_port(order: dict[str, Any], env: dict[str, str]) -> int | None:
    """When this task runs its job's app (the order's `app`): a free port for it, also put
    in `env` as BERTH_APP_PORT; else None."""
    if not order.get("app"):
        return None
    port = free_port()
    env["BERTH_APP_PORT"] = str(port)
    return port


def free_port() -> int:
    """A TCP port free on every address of this machine, for a task's app: the kernel picks
    it (a bind to port 0) and the task binds it moments later ($BERTH_APP_PORT). Picked here,
    where what is free is known, rather than by the server from a range it cannot see."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def add_gpu_samples(tasks: list[RunningTask], samples: list[dict[str, Any]]) -> None:
    """Add each running task's GPUs' mean utilisation now to its running total."""
    for task in tasks:
        mean = task_utilization(task.devices, samples)
        if task.state == TaskState.RUNNING and mean is not None:
            task.gpu_util[0] += mean
            task.gpu_util[1] += 1


def _indices(raw: object) -> list[int]:
    """The GPU indices of a start order (anything else is ignored)."""
    if not isinstance(raw, list):
        return []
    return [i for i in raw if isinstance(i, int) and not isinstance(i, bool)]


def _ended_at(task: RunningTask) -> float:
    """When an adopted task ended: its wrapper wrote the exit file then (now if it did not)."""
    try:
        info = task.exit_file.stat()
    except OSError:
        return time.time()
    return info.st_mtime if info.st_size else time.time()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; fields after it are plain.
    return stat.rsplit(")", 1)[-1].split()[19]


def _whole_utf8(chunk: bytes) -> bytes:
    """`chunk` without a trailing incomplete UTF-8 character (b"" if that is all it holds)."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte < 0x80:
            return chunk  # ends in ASCII
        if byte >= 0xC0:  # the lead byte of the last character
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return chunk if back >= need else chunk[:-back]
    return chunk  # not UTF-8 anyway


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
