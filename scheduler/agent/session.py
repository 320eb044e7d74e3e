"""One node's session with the server, shared by the real agent (`runtime.Agent`) and each
simulated node (`sim.SimNode`): what `register/` told it, one lease request and what its
answer renews, what a report's answer means for the tasks it listed, and which orders are new.

What differs stays with each: the transport's threads (the real agent has a main loop and a
lease thread; the simulator a pool and a lease thread per node) and what a task is (a process
in a cgroup, or a timer). Django-free, like the rest of the node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from scheduler.agent.client import Backoff, Http, ServerError, Unavailable
from scheduler.agent.wire import AwaitingOutput, Orders, Registered, TaskReport, TaskState

log = logging.getLogger("berth.agent")
# An ended attempt is remembered this long: a start that crossed its report is ignored.
FORGET_ENDED_SECONDS = 600.0  # longer than any request that could still carry a late start
MIN_LOG_CHUNK = 256  # the smallest output chunk an agent sends, whatever the server says


class Attempt(Protocol):
    """A task as a session sees it: one attempt of one task."""

    id: int
    attempt: int


class Session:
    """Mixed into the agent and the simulated node, which hold these attributes."""

    token: str  # this node's token ("" before register/)
    lease: float  # seconds the server holds a lease
    grace: float  # seconds between SIGTERM and SIGKILL when the server gives none
    inline_bytes: int  # output up to this size rides in the final report
    log_chunk: int  # bytes of output per log upload
    tasks: dict[int, Any]  # the tasks this node knows, by id (each an Attempt)
    ended: dict[tuple[int, int], float]  # attempts whose end the server took, and when

    def registered(self, answer: dict[str, Any], max_chunk: int) -> Registered:
        """Take what `register/` answered: the token, the lease, the sizes (bounded)."""
        registered = Registered.from_json(answer, self.lease, self.grace, max_chunk)
        self.token, self.lease = registered.token, registered.lease_seconds
        self.grace = registered.kill_grace_seconds
        self.log_chunk = max(MIN_LOG_CHUNK, min(max_chunk, registered.log_chunk_bytes))
        self.inline_bytes = max(0, min(self.log_chunk, registered.inline_output_bytes))
        return registered

    def renewed(self, answer: dict[str, Any]) -> None:
        """Any answer of a report or a lease may change the lease's length."""
        self.lease = float(answer.get("lease_seconds", self.lease))

    def settle(self, reported: list[TaskReport], answer: dict[str, Any],
               now: float) -> tuple[list[Any], list[tuple[Any, AwaitingOutput]]]:  # fmt: skip
        """After a report (under the caller's lock): the ended tasks whose end and output the
        server took are forgotten (returned first, for their files to go), and those whose
        output it still awaits are returned with what it holds, to ship again."""
        awaiting = {(a.id, a.attempt): a for a in Orders.from_json(answer).awaiting_output or []}
        taken: list[Any] = []
        short: list[tuple[Any, AwaitingOutput]] = []
        for item in reported:
            key = (item.id, item.attempt)
            task = self.tasks.get(item.id)
            if item.state == TaskState.RUNNING or task is None or task.attempt != key[1]:
                continue
            if key in awaiting:
                short.append((task, awaiting[key]))
                continue
            del self.tasks[task.id]
            self.ended[key] = now
            taken.append(task)
        for key, when in list(self.ended.items()):
            if now - when > FORGET_ENDED_SECONDS:
                del self.ended[key]
        return taken, short

    def is_new(self, task_id: int, attempt: int) -> bool:
        """A start order for an attempt neither over nor already here (a start repeated by a
        request that crossed our report is not)."""
        current = self.tasks.get(task_id)
        over = (task_id, attempt) in self.ended
        return not over and not (current is not None and current.attempt == attempt)

    def hold_lease(self, http: Http, body: dict[str, Any], timeout: float, stop: threading.Event,
                   backoff: Backoff, refused: Callable[[ServerError, str], None],
                   ) -> dict[str, Any] | None:  # fmt: skip
        """One lease request, held by the server until it has orders or the lease is up: its
        answer, or None once back-pressure, an outage or a refusal was waited out (`refused`
        is told of a refusal first, with the token sent: a 401 means the server no longer
        knows it)."""
        token = self.token
        try:
            answer = http.post("lease/", body, f"Node {token}",
                               timeout=self.lease * 1.25 + timeout)  # fmt: skip
        except Unavailable as exc:
            if not stop.is_set():
                stop.wait(backoff.delay(exc.retry_after))
            return None
        except ServerError as exc:
            refused(exc, token)
            stop.wait(backoff.delay())
            return None
        backoff.reset()
        self.renewed(answer)
        return answer
