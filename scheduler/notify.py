"""Say what changed, after the transaction commits: to browsers, and to waiting agents.

Writers (REST, the scheduler loop, agents' reports) call these inside their transaction;
nothing is sent for a transaction that rolls back.

- `changed()`: collects job, flow and node ids and hands them to the listeners connected
  with `connect()` (the dashboard connects its renderer in `DashboardConfig.ready()`), so the
  scheduler never imports the web side; with no listener nothing is sent.
- `log_appended()`: a task's new output, handed to the listeners of `connect_log()`.
- `terminal_notice()`: a line for the users of some terminal sessions (an idle warning).
- `orders()`: some nodes have new orders (a task to start or to stop). Agents wait for orders
  in a held lease request (scheduler/agentapi/views.py); this wakes the ones concerned through
  the channel layer's group `AGENT_GROUP`, in whatever web process holds them, as soon as
  the transaction commits (not at the end of a `batch()`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from channels.layers import get_channel_layer
from django.db import transaction

T = TypeVar("T")
log = logging.getLogger("berth.notify")
_local = threading.local()
AGENT_GROUP = "berth-agent-orders"
SEND_TIMEOUT = 5.0

# --- the registry: who hears about changes ------------------------------------------------
ChangeListener = Callable[[set[int], set[int], set[int]], None]  # (jobs, flows, nodes)
LogListener = Callable[[int, int, int, str], None]  # (task id, attempt, offset, text)
_change_listeners: list[ChangeListener] = []
_log_listeners: list[LogListener] = []


def connect(listener: ChangeListener) -> None:
    """Call `listener(jobs, flows, nodes)` after each committed change (once per batch)."""
    if listener not in _change_listeners:
        _change_listeners.append(listener)


def connect_log(listener: LogListener) -> None:
    """Call `listener(task_id, attempt, offset, text)` after new output is committed."""
    if listener not in _log_listeners:
        _log_listeners.append(listener)


def disconnect(listener: ChangeListener | LogListener) -> None:
    for listeners in (_change_listeners, _log_listeners):
        if listener in listeners:
            listeners.remove(listener)  # type: ignore[arg-type]


@contextmanager
def batch() -> Iterator[None]:
    """Collect every change committed inside the block and publish them once at its end
    (the scheduler loop publishes once per cycle, not once per job)."""
    outer = getattr(_local, "pending", None)
    if outer is not None:
        yield  # already batching: the outermost block publishes
        return
    _local.pending = (set(), set(), set())
    try:
        yield
    finally:
        jobs, flows, nodes = _local.pending
        _local.pending = None
        _publish(jobs, flows, nodes)


def _publish(jobs: set[int], flows: set[int], nodes: set[int]) -> None:
    if not (jobs or flows or nodes):
        return
    for listener in list(_change_listeners):
        try:
            listener(jobs, flows, nodes)
        except Exception:  # a failed push must never undo or block the scheduler's work
            log.exception("change listener %r failed", listener)


def changed(jobs: Iterable[int] = (), flows: Iterable[int] = (), nodes: Iterable[int] = ()) -> None:
    job_ids, flow_ids, node_ids = set(jobs), set(flows), set(nodes)
    if not (job_ids or flow_ids or node_ids):
        return

    def send() -> None:
        pending = getattr(_local, "pending", None)
        if pending is not None:
            pending[0].update(job_ids)
            pending[1].update(flow_ids)
            pending[2].update(node_ids)
            return
        _publish(job_ids, flow_ids, node_ids)

    transaction.on_commit(send)


def log_appended(task_id: int, attempt: int, offset: int, text: str) -> None:
    """After commit, hand a task's newly stored output to the log listeners."""

    def send() -> None:
        for listener in list(_log_listeners):
            try:
                listener(task_id, attempt, offset, text)
            except Exception:  # a failed push never loses the stored output
                log.exception("log listener %r failed for task %s", listener, task_id)

    if _log_listeners:
        transaction.on_commit(send)


# --- orders for agents -------------------------------------------------------------------


def orders(nodes: Iterable[int] = (), jobs: Iterable[int] = ()) -> None:
    """Right after commit, wake the agents of `nodes` and of the nodes where `jobs` have
    tasks: they have a task to start or to stop. Not held back by `batch()`: an agent gets
    its orders at the commit, not at the end of the scheduler's cycle."""
    node_ids, job_ids = set(nodes), set(jobs)
    if node_ids or job_ids:
        transaction.on_commit(lambda: _wake_agents(node_ids, job_ids))


def _wake_agents(node_ids: set[int], job_ids: set[int]) -> None:
    if not (node_ids or job_ids):
        return
    try:
        if job_ids:
            from scheduler.models import Task
            from scheduler.states.names import TASK_ON_NODE

            node_ids |= set(
                Task.objects.filter(job_id__in=job_ids, state__in=TASK_ON_NODE)
                .exclude(node=None)
                .values_list("node_id", flat=True)
                .distinct()
            )
        layer = get_channel_layer()
        if layer is not None and node_ids:
            message = {"type": "agent.orders", "nodes": sorted(node_ids)}
            run_on_layer_loop(layer.group_send(AGENT_GROUP, message))
    except Exception:  # agents still get their orders when they renew their lease
        log.exception("waking agents failed")


def terminal_notice(channels: Iterable[str], message: str) -> None:
    """Right after commit, show `message` in the terminals whose users' sockets
    (dashboard/shell.py) are `channels`: a line from Berth between the session's output."""
    targets = [c for c in channels if c]
    if targets:
        transaction.on_commit(lambda: _send_notice(targets, message))


def _send_notice(channels: list[str], message: str) -> None:
    from channels.exceptions import ChannelFull

    async def send_all(layer: Any) -> None:
        for channel in channels:
            try:
                await layer.send(channel, {"type": "shell.notice", "message": message})
            except ChannelFull:
                pass  # that terminal is too slow to take it: the event and mail still say it

    try:
        layer = get_channel_layer("shell")
        if layer is not None:
            run_on_layer_loop(send_all(layer))
    except Exception:  # the warning is also an event and a notification
        log.exception("telling terminals failed")


def cross_process_problem() -> str | None:
    """Why this process's orders could not reach agents held by another process (None:
    they can). The in-memory layer delivers only inside its own process: a scheduler loop
    on it, apart from the web tier, would leave a cancelled or preempted task running
    until its agent's next lease (up to BERTH_HEARTBEAT_INTERVAL)."""
    from channels.layers import InMemoryChannelLayer

    layer = get_channel_layer()
    if layer is None:
        return "no channel layer is configured"
    if isinstance(layer, InMemoryChannelLayer):
        return "the channel layer is in-memory (REDIS_URL is not set)"
    return None


# --- the event loop the channel layer lives on -------------------------------------------
# The in-memory layer's queues belong to the loop that waits on them, and the Redis layer
# allows receive() on one loop per process and keeps its connection pool per loop. So every
# waiter and every sender in a process uses one loop: the ASGI server's (remembered by the
# lease view, which runs on it) or else one private loop thread (the scheduler process, a
# WSGI server, tests), instead of a fresh loop per call as async_to_sync would make.
_server_loop: asyncio.AbstractEventLoop | None = None
_own_loop: asyncio.AbstractEventLoop | None = None
_own_lock = threading.Lock()


def remember_server_loop() -> None:
    """Called on the ASGI server's own loop."""
    global _server_loop
    _server_loop = asyncio.get_running_loop()


def layer_loop() -> asyncio.AbstractEventLoop:
    global _own_loop
    loop = _server_loop
    if loop is not None and loop.is_running() and not loop.is_closed():
        return loop
    with _own_lock:
        if _own_loop is None or _own_loop.is_closed():
            _own_loop = asyncio.new_event_loop()
            threading.Thread(target=_own_loop.run_forever, name="berth-notify", daemon=True).start()
        return _own_loop


def run_on_layer_loop(coroutine: Coroutine[Any, Any, T]) -> T | None:
    """From sync code: run `coroutine` on the layer's loop and wait for it (or only schedule
    it, from a thread that itself runs that loop)."""
    loop = layer_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    if running is not None:
        return None
    return future.result(timeout=SEND_TIMEOUT)


async def on_layer_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """From async code on any loop: await `coroutine` run on the layer's loop."""
    loop = layer_loop()
    if asyncio.get_running_loop() is loop:
        return await coroutine
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))


class _Waiter:
    """One held lease, as the dispatcher sees it: its node (once known) and its wake-up."""

    def __init__(self) -> None:
        self.node_id: int | None = None
        self.seen: set[int] = set()  # nodes woken before this lease knew its own node
        self.event = asyncio.Event()


class _Dispatcher:
    """This process's one subscription to AGENT_GROUP, living on the layer's loop. It hands
    each wake-up to the held leases of the nodes it names, in-process: a held lease costs no
    channel of its own, and a wake-up is read once per process, not once per held lease.
    It receives only while some lease is held (the membership stays: a wake-up sent in
    between waits in the channel), so no receive outlives the leases on its loop."""

    REFRESH_SECONDS = 3600.0  # the membership is renewed long before the layer forgets it

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel = ""
        self.by_node: dict[int, set[_Waiter]] = {}
        self.unbound: set[_Waiter] = set()
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.failed = False
        self.refreshed = 0.0  # when the membership was last added

    @property
    def alive(self) -> bool:
        return not self.ready.done() or (self.ready.result() and not self.failed)

    async def start(self) -> None:
        try:
            self.channel = str(await self.layer.new_channel("agent-orders."))
            await self.layer.group_add(AGENT_GROUP, self.channel)
            self.refreshed = asyncio.get_running_loop().time()
        except Exception:
            log.warning("channel layer unavailable; held leases poll instead", exc_info=True)
            self.ready.set_result(False)
            return
        self.ready.set_result(True)

    async def _run(self) -> None:
        refreshing = asyncio.ensure_future(self._refresh())
        try:
            while True:
                message = await self.layer.receive(self.channel)
                self.deliver(message.get("nodes", ()))
        except Exception:
            log.warning("channel layer failed; held leases poll instead", exc_info=True)
            self.failed = True
            self.deliver(list(self.by_node))  # every held lease looks again, then polls
        finally:
            refreshing.cancel()

    async def _refresh(self) -> None:
        """Renew the membership every REFRESH_SECONDS while receiving: a process whose
        leases are held without a break for longer than the layer's group expiry would
        otherwise stop hearing wake-ups (leases would then wait out their whole time)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(max(0.0, self.refreshed + self.REFRESH_SECONDS - loop.time()))
                self.refreshed = loop.time()
                await self.layer.group_add(AGENT_GROUP, self.channel)
        except Exception:  # the receive loop notices a failed layer and falls back to polling
            log.warning("could not renew the agents' group membership", exc_info=True)

    def deliver(self, nodes: Iterable[int]) -> None:
        nodes = set(nodes)
        for node_id in nodes:
            for waiter in self.by_node.get(node_id, ()):
                waiter.event.set()
        for waiter in self.unbound:
            waiter.seen |= nodes

    def add(self, waiter: _Waiter) -> None:
        self.unbound.add(waiter)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    def bind(self, waiter: _Waiter, node_id: int) -> None:
        if waiter.node_id is None:
            self.unbound.discard(waiter)
            waiter.node_id = node_id
            self.by_node.setdefault(node_id, set()).add(waiter)
            if node_id in waiter.seen:
                waiter.event.set()

    def remove(self, waiter: _Waiter) -> None:
        self.unbound.discard(waiter)
        held = self.by_node.get(waiter.node_id) if waiter.node_id is not None else None
        if held is not None:
            held.discard(waiter)
            if not held:
                del self.by_node[waiter.node_id]  # type: ignore[arg-type]
        if not (self.by_node or self.unbound) and self.task is not None:
            self.task.cancel()  # no lease held here: stop receiving until the next one
            self.task = None


_dispatchers: dict[asyncio.AbstractEventLoop, _Dispatcher] = {}


async def _dispatcher(layer: Any) -> _Dispatcher | None:
    """This loop's dispatcher for `layer`, started on first use (on the layer's loop)."""
    loop = asyncio.get_running_loop()
    current = _dispatchers.get(loop)
    if current is None or current.layer is not layer or not current.alive:
        for old in [k for k in _dispatchers if k.is_closed()]:
            del _dispatchers[old]  # loops of finished tests or servers
        current = _dispatchers[loop] = _Dispatcher(layer)
        await current.start()
    return current if await current.ready else None


class OrdersWaiter:
    """A held lease's subscription: `await wait(node_id, timeout)` returns True when orders
    for that node were committed since `open()` (look again), False when `timeout` passed.

    Open before reading the orders from the database, so that a commit between the read
    and the wait still wakes us. The process's dispatcher (one channel-layer subscription
    for all its held leases) does the listening. If the channel layer fails, the waiter
    says "look again" every POLL_WITHOUT_LAYER seconds instead: orders come a little later,
    never an error.
    """

    POLL_WITHOUT_LAYER = 1.0

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.dispatcher: _Dispatcher | None = None
        self.waiter: _Waiter | None = None

    async def open(self) -> None:
        if self.layer is not None:
            await on_layer_loop(self._open())

    async def _open(self) -> None:
        self.dispatcher = await _dispatcher(self.layer)
        if self.dispatcher is not None:
            self.waiter = _Waiter()
            self.dispatcher.add(self.waiter)

    async def wait(self, node_id: int, timeout: float) -> bool:
        if timeout <= 0:
            return False
        if self.dispatcher is None or self.waiter is None or not self.dispatcher.alive:
            await asyncio.sleep(min(timeout, self.POLL_WITHOUT_LAYER))
            return True
        return await on_layer_loop(self._wait(node_id, timeout))

    async def _wait(self, node_id: int, timeout: float) -> bool:
        assert self.dispatcher is not None and self.waiter is not None
        self.dispatcher.bind(self.waiter, node_id)
        try:
            await asyncio.wait_for(self.waiter.event.wait(), timeout)
        except TimeoutError:
            return False
        self.waiter.event.clear()
        return True

    async def close(self) -> None:
        if self.dispatcher is not None and self.waiter is not None:
            dispatcher, waiter, self.waiter = self.dispatcher, self.waiter, None
            await on_layer_loop(_remove(dispatcher, waiter))


async def _remove(dispatcher: _Dispatcher, waiter: _Waiter) -> None:
    dispatcher.remove(waiter)
