"""GPU utilisation history: the samples agents send with their lease renewals, kept bounded,
and read back as chart series for a node's GPUs or a job's (docs/metrics.md).

- Writing: `parse_samples` validates `usage.gpus` of a lease or report body (at most one
  sample per device, numbers in range; errors name the field); `record_samples` writes a
  node's samples in one statement, at most once per BERTH_GPU_SAMPLE_SECONDS, stamped with
  the server's clock (an agent's clock may be wrong).
- Bounding: `prune_samples` deletes samples older than BERTH_GPU_HISTORY_SECONDS in one
  statement; the scheduler loop calls `prune_if_due` every cycle (it prunes once a minute).
  So a device holds at most HISTORY / SAMPLE samples.
- Reading: `node_history` and `job_history` answer `{x, series, until, live, step}`: times in
  Unix seconds shared by every series (null where a device has no sample), averaged into at
  most MAX_POINTS buckets; `after` gives only what came after a previous answer's `until`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from scheduler.models import Device, DeviceSample, Job, Node

MAX_SAMPLES = 256  # per body: more GPUs than any machine has
MAX_MEMORY = 2**50  # bytes (1 PiB): anything larger is not a GPU's memory
MAX_POINTS = 720  # per series in one answer: a chart is at most a few hundred pixels wide
MAX_SERIES = 64  # devices in one job's chart
PRUNE_EVERY = 60.0  # seconds between the scheduler loop's prunes
_pruned_at = -math.inf


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization: int
    memory_used: int
    memory_total: int


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_samples(raw: object, errors: dict[str, list[str]]) -> list[GpuSample]:
    """The `usage.gpus` list of an agent's body; problems go to `errors` by field path."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors["usage.gpus"] = ["must be a list of samples"]
        return []
    if len(raw) > MAX_SAMPLES:
        errors["usage.gpus"] = [f"at most {MAX_SAMPLES} samples"]
        return []
    samples = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        path = f"usage.gpus.{i}"
        if not isinstance(item, dict):
            errors[path] = ["must be an object"]
            continue
        index, used, total = item.get("index"), item.get("memory_used"), item.get("memory_total")
        utilization = item.get("utilization")
        ok = True
        if not _whole(index, 0, 2**31 - 1):
            errors[f"{path}.index"] = ["must be a GPU index (a non-negative integer)"]
            ok = False
        elif index in seen:
            errors[f"{path}.index"] = [f"GPU {index} has another sample in this body"]
            ok = False
        if (
            isinstance(utilization, bool)
            or not isinstance(utilization, int | float)
            or not 0 <= utilization <= 100  # NaN fails this too
        ):
            errors[f"{path}.utilization"] = ["must be a percentage from 0 to 100"]
            ok = False
        if not _whole(total, 0, MAX_MEMORY):
            errors[f"{path}.memory_total"] = [f"must be bytes, from 0 to {MAX_MEMORY}"]
            ok = False
        if not _whole(used, 0, MAX_MEMORY):
            errors[f"{path}.memory_used"] = [f"must be bytes, from 0 to {MAX_MEMORY}"]
            ok = False
        elif _whole(total, 0, MAX_MEMORY) and used > total:  # type: ignore[operator]
            errors[f"{path}.memory_used"] = ["must not exceed memory_total"]
            ok = False
        if ok:
            assert isinstance(index, int) and isinstance(used, int) and isinstance(total, int)
            assert isinstance(utilization, int | float)
            seen.add(index)
            samples.append(GpuSample(index, round(utilization), used, total))
    return samples


def record_samples(node: Node, samples: list[GpuSample], now: datetime) -> int:
    """Keep `node`'s samples, unless it sent some less than BERTH_GPU_SAMPLE_SECONDS ago (the
    caller holds the node's row lock and saves `gpu_sampled_at`). A sample for a GPU the server
    does not know (its row deleted by staff) is dropped: it must not cost the node its lease.
    Returns how many were written."""
    if not samples:
        return 0
    if node.gpu_sampled_at is not None and now - node.gpu_sampled_at < timedelta(
        seconds=settings.BERTH_GPU_SAMPLE_SECONDS
    ):
        return 0
    devices = dict(Device.objects.filter(node=node).values_list("index", "pk"))
    rows = [
        DeviceSample(device_id=devices[s.index], time=now, utilization=s.utilization,
                     memory_used=s.memory_used)
        for s in samples
        if s.index in devices
    ]  # fmt: skip
    DeviceSample.objects.bulk_create(rows)
    node.gpu_sampled_at = now
    return len(rows)


def prune_samples(now: datetime) -> int:
    """Delete the samples older than BERTH_GPU_HISTORY_SECONDS (one statement)."""
    cutoff = now - timedelta(seconds=settings.BERTH_GPU_HISTORY_SECONDS)
    deleted, _ = DeviceSample.objects.filter(time__lt=cutoff).delete()
    return deleted


def prune_if_due() -> int:
    """The scheduler loop's unit: prune at most once every PRUNE_EVERY seconds."""
    global _pruned_at
    if time.monotonic() - _pruned_at < PRUNE_EVERY:
        return 0
    _pruned_at = time.monotonic()
    return prune_samples(timezone.now())


# --- reading ---------------------------------------------------------------------------


@dataclass
class Window:
    """One device's part of a chart: its samples from `start` to `end`."""

    device: Device
    start: datetime
    end: datetime

    @property
    def label(self) -> str:
        return f"{self.device.node.name} GPU {self.device.index}"


def _unix(when: datetime) -> float:
    return when.timestamp()


def _series(windows: list[Window], after: float | None, live: bool) -> dict[str, Any]:
    floor = datetime.fromtimestamp(after, UTC) if after is not None else None
    starts = [max(w.start, floor) if floor else w.start for w in windows]
    span = max((_unix(w.end) - _unix(s) for w, s in zip(windows, starts, strict=True)), default=0)
    step = max(1, math.ceil(span / MAX_POINTS))
    wanted = Q(pk__in=[])
    for w, start in zip(windows, starts, strict=True):
        wanted |= Q(device_id=w.device.pk, time__gt=start, time__lte=w.end)
    buckets: dict[int, dict[int, list[int]]] = defaultdict(dict)  # device -> bucket -> sums
    until = after or 0.0
    rows = DeviceSample.objects.filter(wanted).values_list(
        "device_id", "time", "utilization", "memory_used"
    )
    for device_id, when, utilization, memory_used in rows.iterator(chunk_size=2000):
        seconds = _unix(when)
        until = max(until, seconds)
        bucket = int(seconds // step) * step
        sums = buckets[device_id].setdefault(bucket, [0, 0, 0])
        sums[0] += utilization
        sums[1] += 1
        sums[2] = max(sums[2], memory_used)  # the peak: what a job needs to fit
    x = sorted({b for per in buckets.values() for b in per})
    series = []
    for w in windows:
        per = buckets.get(w.device.pk, {})
        series.append({
            "node": w.device.node.name, "index": w.device.index, "label": w.label,
            "model": w.device.model, "memory_total": w.device.memory,
            "utilization": [round(per[b][0] / per[b][1], 1) if b in per else None for b in x],
            "memory_used": [per[b][2] if b in per else None for b in x],
        })  # fmt: skip
    return {"x": x, "series": series, "until": until or None, "live": live, "step": step}


def node_history(node: Node, window: float, after: float | None = None) -> dict[str, Any]:
    """Each of `node`'s GPUs over the last `window` seconds."""
    now = timezone.now()
    start = now - timedelta(seconds=window)
    devices = Device.objects.filter(node=node).select_related("node").order_by("index")
    return _series([Window(d, start, now) for d in devices], after, live=True)


def job_history(job: Job, after: float | None = None) -> dict[str, Any]:
    """The GPUs `job`'s tasks hold or held, each over the time its task had it (a device
    another job used before or after is not shown outside this job's time)."""
    now = timezone.now()
    oldest = now - timedelta(seconds=settings.BERTH_GPU_HISTORY_SECONDS)
    spans: dict[tuple[int, int], tuple[datetime, datetime]] = {}
    for task in job.tasks.exclude(node=None).only(
        "node_id", "device_indices", "assigned_at", "started_at", "finished_at"
    ):
        begin = task.started_at or task.assigned_at
        if begin is None or task.node_id is None:
            continue
        end = task.finished_at or now
        for index in task.device_indices or []:
            key = (task.node_id, int(index))
            old = spans.get(key)
            spans[key] = (min(old[0], begin), max(old[1], end)) if old else (begin, end)
    keys = sorted(spans)[:MAX_SERIES]
    wanted = Q(pk__in=[])
    for node_id, index in keys:
        wanted |= Q(node_id=node_id, index=index)
    devices = {
        (d.node_id, d.index): d for d in Device.objects.filter(wanted).select_related("node")
    }
    windows = [
        Window(devices[k], max(spans[k][0], oldest), spans[k][1]) for k in keys if k in devices
    ]
    windows.sort(key=lambda w: (w.device.node.name, w.device.index))
    return _series(windows, after, live=not job.is_finished)
