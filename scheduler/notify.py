"""Say what changed; the dashboard pushes it to browsers after the transaction commits.

Writers (REST, the scheduler loop, agents' heartbeats) call these inside their transaction;
nothing is sent for a transaction that rolls back. The dashboard's `dashboard.live.publish`
renders and sends; this module only collects ids so the scheduler never imports the web side.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction

log = logging.getLogger("berth.notify")


def changed(jobs: Iterable[int] = (), flows: Iterable[int] = (), nodes: Iterable[int] = ()) -> None:
    job_ids, flow_ids, node_ids = set(jobs), set(flows), set(nodes)
    if not (job_ids or flow_ids or node_ids):
        return

    def send() -> None:
        try:
            from dashboard.live import publish
        except ImportError:
            return
        try:
            publish(jobs=job_ids, flows=flow_ids, nodes=node_ids)
        except Exception:  # a failed push must never undo or block the scheduler's work
            log.exception("live publish failed")

    transaction.on_commit(send)
