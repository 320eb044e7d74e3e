"""Exact resource arithmetic: cpu in millicores, memory in bytes, whole GPUs."""

from __future__ import annotations

from dataclasses import dataclass

DIMENSIONS = ("cpu", "memory", "gpu")


@dataclass(frozen=True, slots=True)
class Resources:
    cpu: int = 0
    memory: int = 0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)

    def fits_in(self, other: Resources) -> bool:
        return self.cpu <= other.cpu and self.memory <= other.memory and self.gpu <= other.gpu

    def is_zero(self) -> bool:
        return self.cpu == 0 and self.memory == 0 and self.gpu == 0

    def short_of(self, available: Resources) -> list[str]:
        """The dimensions in which this request exceeds `available`."""
        return [d for d in DIMENSIONS if getattr(self, d) > getattr(available, d)]
