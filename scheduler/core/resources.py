"""Exact resource arithmetic: cpu in millicores, memory in bytes, whole GPUs."""

from __future__ import annotations

from typing import Any, NamedTuple

from scheduler.core.quantity import (
    format_cpu,
    format_memory,
    parse_cpu,
    parse_gpu_field,
    parse_memory,
)

DIMENSIONS = ("cpu", "memory", "gpu")
# `Resources(a, b, c)` goes through a generated Python `__new__`; `tuple_new(Resources, (a, b, c))`
# makes the same tuple without it (for the hot paths of a replay).
tuple_new = tuple.__new__


class Resources(NamedTuple):
    """Immutable; a named tuple because the core makes millions of them in a replay (a
    tuple is several times cheaper to create than a frozen dataclass). `+` and `-` work per
    dimension, not as tuple concatenation."""

    cpu: int = 0
    memory: int = 0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:  # type: ignore[override]
        return tuple_new(
            Resources, (self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)
        )

    def __sub__(self, other: Resources) -> Resources:
        return tuple_new(
            Resources, (self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)
        )

    def fits_in(self, other: Resources) -> bool:
        return self.cpu <= other.cpu and self.memory <= other.memory and self.gpu <= other.gpu

    def is_zero(self) -> bool:
        return self.cpu == 0 and self.memory == 0 and self.gpu == 0

    def dominant_share(self, total: Resources) -> float:
        """DRF's dominant share: the largest fraction of `total` this holds in any dimension
        (a dimension the cluster has none of counts 0). The scheduler's queue order and the
        dashboard's queue bars both read it here."""
        best = 0.0  # each dimension in turn, as `max(best, share)` would keep it
        cpu, memory, gpu = total
        if cpu and self.cpu / cpu > best:
            best = self.cpu / cpu
        if memory and self.memory / memory > best:
            best = self.memory / memory
        if gpu and self.gpu / gpu > best:
            best = self.gpu / gpu
        return best

    @classmethod
    def parse(cls, data: dict[str, Any] | None) -> Resources:
        """From a spec's `resources` mapping (absent dimensions are 0; a fraction of a GPU
        is the one device it goes on, a MIG instance no whole device: `parse_gpu_field`)."""
        data = data or {}
        return cls(
            cpu=parse_cpu(data.get("cpu", 0)),
            memory=parse_memory(data.get("memory", 0)),
            gpu=parse_gpu_field(data.get("gpu", 0))[0],
        )

    def describe(self, dimension: str) -> str:
        """One dimension as people write it: `500m`, `2Gi`, `4`."""
        value = getattr(self, dimension)
        if dimension == "cpu":
            return format_cpu(value)
        if dimension == "memory":
            return format_memory(value)
        return str(value)

    def short_of(self, available: Resources) -> list[str]:
        """The dimensions in which this request exceeds `available`."""
        return [d for d in DIMENSIONS if getattr(self, d) > getattr(available, d)]
