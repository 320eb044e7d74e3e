"""Many fake nodes in one process, over the same HTTP protocol as real agents (Django-free).

A task "runs" for BERTH_SIM_DURATION seconds from its env (default: half its walltime, or
1 s) and exits with BERTH_SIM_EXIT (default 0), writing one line of output.

Each node keeps one lease request open in a thread of its own (a blocked thread costs a
socket and a little memory, nothing else); one clock thread ends fake tasks when they are
due, and a small pool sends the reports and output, one report at a time per node. At rest
a node costs one lease renewal per lease; a task's end reaches the server at once.

Protocol 3 keeps a task to two requests: the held lease that brings its start, and its final
report with its output inline. The lease sent next (it is sent at once, to wait for the next
orders) lists the task Running and so confirms its start; it waits for any report built
before the start to be answered, so that no report sent after it leaves the task out.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from scheduler.agent.client import PROTOCOL, Backoff, Http, ServerError, Unavailable
from scheduler.agent.gpumodes import TIMESLICE
from scheduler.agent.gpus import FAKE_MEMORY, fake_level, fake_samples, task_utilization
from scheduler.agent.runtime import AWAIT_OUTPUT_SECONDS, LOG_CHUNK
from scheduler.agent.session import Session
from scheduler.agent.wire import (
    InlineOutput,
    KillOrder,
    LogChunk,
    Registration,
    StartOrder,
    TaskReport,
    TaskState,
)

log = logging.getLogger("berth.simagent")
COUNT_LOG_SECONDS = 2.0  # how often the requests sent so far are logged (when they changed)


@dataclass
class SimTask:
    id: int
    attempt: int
    ends_at: float
    exit_code: int | None
    state: str = TaskState.RUNNING
    output: str = ""  # shipped before the final report
    logged: bool = False
    devices: list[int] = field(default_factory=list)  # GPU indices the server gave it
    level: int | None = None  # its fake GPUs' utilisation, when its env fixes it (gpus.py)


@dataclass
class SimNode(Session):
    name: str
    cpu: int
    memory: int
    gpus: int
    labels: dict[str, str]
    lease_http: Http
    token: str = ""
    lease: float = 10.0
    grace: float = 10.0
    log_chunk: int = LOG_CHUNK
    tasks: dict[int, SimTask] = field(default_factory=dict)
    ended: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = True  # a report is due
    reporting: bool = False  # a pool worker is sending this node's reports
    ticks: int = 0  # lease renewals sent: the fake GPUs' clock
    inline_bytes: int = 0  # output up to this size rides in the final report
    reports_built: int = 0  # reports whose body was built (under `lock`)
    reports_done: int = 0  # ... and answered (under `answered`)
    confirm_after: int = 0  # the next lease waits until this many reports were answered
    answered: threading.Condition = field(default_factory=threading.Condition)

    def task_reports(self, inline: bool = False) -> list[TaskReport]:
        return [
            TaskReport(
                t.id,
                t.attempt,
                TaskState(t.state),
                None if t.state == TaskState.RUNNING else t.exit_code,
                output_bytes=len(t.output.encode()),
                output=InlineOutput(0, t.output) if inline and self.travels_inline(t) else None,
            )  # fmt: skip
            for t in self.tasks.values()
        ]

    def task_list(self, inline: bool = False) -> list[dict[str, Any]]:
        """`task_reports` as they travel."""
        return [report.to_json() for report in self.task_reports(inline)]

    def travels_inline(self, task: SimTask) -> bool:
        """An ended task's output short enough for its final report (else a log upload)."""
        size = len(task.output.encode())
        return task.state != TaskState.RUNNING and not task.logged and 0 < size <= self.inline_bytes

    def gpu_samples(self) -> list[dict[str, int]]:
        """Fake utilisation for the lease: busy while a running task holds the GPU."""
        self.ticks += 1
        running = [t for t in self.tasks.values() if t.state == TaskState.RUNNING]
        busy = [i for t in running for i in t.devices]
        levels = {i: t.level for t in running if t.level is not None for i in t.devices}
        return fake_samples(range(self.gpus), busy, self.ticks, levels)

    def lease_body(self) -> dict[str, Any]:
        """Tasks and GPU samples, each running GPU task with its GPUs' mean utilisation in
        them, as a real agent's lease (runtime.Agent.lease_body). Under `lock`."""
        samples = self.gpu_samples()
        tasks = self.task_reports()
        for item, task in zip(tasks, self.tasks.values(), strict=True):
            running = task.state == TaskState.RUNNING
            mean = task_utilization(task.devices, samples) if running else None
            if mean is not None:
                item.gpu_utilization = round(mean, 1)
        return {"tasks": [t.to_json() for t in tasks], "usage": {"gpus": samples}}


def _duration(order: StartOrder) -> float:
    if "BERTH_SIM_DURATION" in order.env:
        return float(order.env["BERTH_SIM_DURATION"])
    return float(order.walltime) / 2 if order.walltime else 1.0


class SimCluster:
    def __init__(
        self, server: str, join_token: str, nodes: int, gpus: int, cpu: int, memory: int,
        prefix: str = "sim", labels: dict[str, str] | None = None, workers: int = 8,
        timeout: float = 10.0,
    ) -> None:  # fmt: skip
        self.server = server
        self.join_token = join_token
        self.timeout = timeout
        self.nodes = [
            SimNode(
                f"{prefix}-{i:04d}", cpu, memory, gpus, dict(labels or {}), Http(server, timeout)
            )  # fmt: skip
            for i in range(nodes)
        ]
        self.workers = workers
        self.local = threading.local()  # one keep-alive connection per pool worker
        self.clock: list[tuple[float, int, SimNode, int, int]] = []
        self.clock_cv = threading.Condition()
        self.seq = itertools.count()
        self.stop = threading.Event()
        self.pool: ThreadPoolExecutor | None = None
        self.sent: Counter[str] = Counter()  # requests sent, by kind (register, lease, ...)
        self.sent_lock = threading.Lock()

    def count(self, path: str) -> None:
        kind = "log" if path.endswith("/log/") else path.rstrip("/")
        with self.sent_lock:
            self.sent[kind] += 1

    # --- HTTP --------------------------------------------------------------------------

    def _http(self) -> Http:
        http = getattr(self.local, "http", None)
        if http is None:
            http = self.local.http = Http(self.server, self.timeout)
        return http

    def _post(self, node: SimNode, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        """POST, waiting out back-pressure (429/503, Retry-After) and outages: a report or a
        chunk of output is never given up. Raises Unavailable only when stopping."""
        backoff = Backoff()
        while True:
            self.count(path)
            try:
                return self._http().post(path, body, auth)
            except Unavailable as exc:
                wait = backoff.delay(exc.retry_after)
                log.warning("node %s: %s; retrying in %.1fs", node.name, exc, wait)
                if self.stop.wait(wait):
                    raise

    def register(self, node: SimNode) -> None:
        devices = [{"index": i, "uuid": f"sim-{node.name}-{i}", "model": "sim",
                    "memory": FAKE_MEMORY} for i in range(node.gpus)]  # fmt: skip
        # Fake GPUs offer plain time-slicing, as a real agent's --fake-gpus do (gpumodes.py).
        body = Registration(node.name, node.cpu, node.memory, node.labels, devices, node.name,
                            f"berth-simagent/{PROTOCOL}",
                            gpu_sharing=[TIMESLICE] if devices else [])  # fmt: skip
        answer = self._post(node, "register/", body.to_json(), f"Bearer {self.join_token}")
        with node.lock:
            node.registered(answer, LOG_CHUNK)

    # --- reports -----------------------------------------------------------------------

    def report_soon(self, node: SimNode) -> None:
        """A report is due: send it now on a pool worker (or right after the one in flight)."""
        with node.lock:
            node.dirty = True
            if node.reporting or self.pool is None:
                return
            node.reporting = True
        self.pool.submit(self._reports, node)

    def _reports(self, node: SimNode) -> None:
        try:
            while not self.stop.is_set():
                with node.lock:
                    if not node.dirty:
                        node.reporting = False
                        return
                    node.dirty = False
                self._report(node)
        except Exception as exc:
            with node.lock:
                node.reporting = False
                node.dirty = True
            if isinstance(exc, ServerError) and exc.status == 401:
                node.token = ""
            if not isinstance(exc, Unavailable):
                log.warning("node %s: report failed: %s", node.name, exc)

    def _report(self, node: SimNode) -> None:
        if not node.token:
            self.register(node)
        auth = f"Node {node.token}"
        with node.lock:
            unlogged = [t for t in node.tasks.values()
                        if t.state != TaskState.RUNNING and not t.logged
                        and not node.travels_inline(t)]  # fmt: skip
        for task in unlogged:  # the output first: the server ends a task only once it has it
            chunk = LogChunk(task.attempt, 0, task.output)
            self._post(node, f"tasks/{task.id}/log/", chunk.to_json(), auth)
            task.logged = True
        with node.lock:
            reported = node.task_reports(inline=True)
            node.reports_built += 1
            built = node.reports_built
        try:
            answer = self._post(node, "report/", {"tasks": [r.to_json() for r in reported]}, auth)
        finally:
            with node.answered:
                node.reports_done = max(node.reports_done, built)
                node.answered.notify_all()
        with node.lock:
            _, short = node.settle(reported, answer, time.monotonic())
            for held, _ in short:  # its output is shipped again before the next report
                held.logged = False
                node.dirty = True
        if short:
            self.stop.wait(AWAIT_OUTPUT_SECONDS)
        self.apply_orders(node, answer)

    # --- orders and fake tasks ---------------------------------------------------------

    def apply_orders(self, node: SimNode, answer: dict[str, Any], by_lease: bool = False) -> None:
        """Carry out orders. Starts that came with a lease are confirmed by the next lease;
        any other change is reported."""
        changed = started = False
        now = time.monotonic()
        with node.lock:
            for kill in answer.get("kill", []):
                key = KillOrder.from_json(kill)[:2]
                target = node.tasks.get(key[0])
                if target is not None and target.attempt == key[1]:
                    if target.state == TaskState.RUNNING:
                        target.state, target.exit_code = TaskState.KILLED, 143
                        changed = True
                elif node.is_new(*key):  # stopped before it started here
                    node.tasks[key[0]] = SimTask(key[0], key[1], now, None, state=TaskState.KILLED)
                    changed = True
            for start in answer.get("start", []):
                order = StartOrder.from_json(start)
                key = (order.id, order.attempt)
                if not node.is_new(*key):
                    continue
                code = int(order.env.get("BERTH_SIM_EXIT", 0))
                task = SimTask(key[0], key[1], now + _duration(order), code,
                               devices=order.devices, level=fake_level(order.env))  # fmt: skip
                task.output = f"simulated task {task.id} on {node.name}: exit {code}\n"
                node.tasks[key[0]] = task
                self._due(task.ends_at, node, task)
                started = True
            if started and by_lease:
                node.confirm_after = node.reports_built
            changed = changed or (started and not by_lease)
        if changed:
            self.report_soon(node)

    def _wait_for_older_reports(self, node: SimNode) -> None:
        """Before a lease that lists tasks just started: every report built before they
        started has been answered, so none that leaves them out arrives after this lease."""
        with node.answered:
            node.answered.wait_for(
                lambda: node.reports_done >= node.confirm_after or self.stop.is_set(),
                timeout=self.timeout,
            )

    def _due(self, when: float, node: SimNode, task: SimTask) -> None:
        with self.clock_cv:
            heapq.heappush(self.clock, (when, next(self.seq), node, task.id, task.attempt))
            self.clock_cv.notify()

    def _clock_loop(self) -> None:
        """End fake tasks when they are due and report them at once."""
        logged: dict[str, int] = {}
        log_at = time.monotonic() + COUNT_LOG_SECONDS
        while not self.stop.is_set():
            if time.monotonic() >= log_at:
                logged, log_at = self.log_sent(logged), time.monotonic() + COUNT_LOG_SECONDS
            with self.clock_cv:
                now = time.monotonic()
                if not self.clock or self.clock[0][0] > now:
                    wait = self.clock[0][0] - now if self.clock else 0.5
                    self.clock_cv.wait(min(wait, 0.5))
                    continue
                _, _, node, task_id, attempt = heapq.heappop(self.clock)
            with node.lock:
                task = node.tasks.get(task_id)
                ended = (
                    task is not None and task.attempt == attempt and task.state == TaskState.RUNNING
                )
                if ended:
                    assert task is not None
                    task.state = TaskState.SUCCEEDED if task.exit_code == 0 else TaskState.FAILED
            if ended:
                self.report_soon(node)

    def log_sent(self, before: dict[str, int]) -> dict[str, int]:
        """Log the requests sent so far by kind, when they changed (bench/e2e.py reads it)."""
        with self.sent_lock:
            now = dict(self.sent)
        if now != before:
            log.info("requests sent: %s", " ".join(f"{k}={v}" for k, v in sorted(now.items())))
        return now

    def _lease_loop(self, node: SimNode) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            if not node.token:  # not registered yet, or the server forgot us
                self.report_soon(node)  # registers first
                self.stop.wait(0.2 if node.reporting else backoff.delay())
                continue
            self._wait_for_older_reports(node)
            with node.lock:
                body = node.lease_body()
            self.count("lease/")
            answer = node.hold_lease(node.lease_http, body, self.timeout, self.stop, backoff,
                                     partial(self._lease_refused, node))  # fmt: skip
            if answer is not None:
                self.apply_orders(node, answer, by_lease=True)

    def _lease_refused(self, node: SimNode, exc: ServerError, token: str) -> None:
        if exc.status == 401:
            node.token = ""
            self.report_soon(node)  # registers again
        log.warning("node %s: lease refused: %s", node.name, exc)

    # --- running -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        threads = [threading.Thread(target=self._clock_loop, name="sim-clock", daemon=True)]
        with ThreadPoolExecutor(self.workers, thread_name_prefix="sim-report") as pool:
            self.pool = pool
            for node in self.nodes:
                self.report_soon(node)  # registers, then reports its (empty) state
            threads += [
                threading.Thread(
                    target=self._lease_loop, args=(node,), name=f"sim-lease-{i}", daemon=True
                )  # fmt: skip
                for i, node in enumerate(self.nodes)
            ]
            for thread in threads:
                thread.start()
            stop.wait()
            with self.clock_cv:
                self.clock_cv.notify_all()
            for node in self.nodes:
                node.lease_http.abort()
            for thread in threads:
                thread.join(timeout=5)
