"""TTL for flows: a finished flow is deleted with its own jobs, and only those."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from scheduler import notify
from scheduler.models import Flow
from scheduler.states.names import FLOW_FINAL

log = logging.getLogger("berth.flows")


def cleanup_flows(now: datetime) -> int:
    deleted = 0
    candidates = Flow.objects.filter(
        state__in=FLOW_FINAL, finished_at__isnull=False, ttl_seconds_after_finished__isnull=False
    ).values_list("id", "finished_at", "ttl_seconds_after_finished")
    for flow_id, finished_at, ttl in candidates:
        if finished_at + timedelta(seconds=ttl) > now:
            continue
        try:
            with transaction.atomic():
                flow = Flow.objects.filter(pk=flow_id, state__in=FLOW_FINAL).first()
                if flow is None:
                    continue
                job_ids = list(flow.jobs.values_list("id", flat=True))
                flow.delete()  # its steps and its own jobs go by foreign key, nothing else
                notify.changed(flows=[flow_id], jobs=job_ids)
                deleted += 1
        except Exception:
            log.exception("TTL cleanup of flow %s failed", flow_id)
    return deleted
