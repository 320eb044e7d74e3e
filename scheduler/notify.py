"""Say what changed; the dashboard pushes it to browsers after the transaction commits.

Writers (REST, the scheduler loop, agents' heartbeats) call these inside their transaction;
nothing is sent for a transaction that rolls back. The dashboard's `dashboard.live.publish`
renders and sends; this module only collects ids so the scheduler never imports the web side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import transaction

log = logging.getLogger("berth.notify")
_local = threading.local()


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
    try:
        from dashboard.live import publish
    except ImportError:
        return
    try:
        publish(jobs=jobs, flows=flows, nodes=nodes)
    except Exception:  # a failed push must never undo or block the scheduler's work
        log.exception("live publish failed")


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
