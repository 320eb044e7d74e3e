"""The query meter counts every query it wraps, the ones that fail included, and hands
each one's time to `count` (the loop counts per phase, the benchmarks in totals)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cycle.meter import QueryMeter


def test_it_counts_each_query_and_its_time_and_passes_the_answer_on():
    meter = QueryMeter()
    seen: list[tuple[Any, ...]] = []

    def execute(sql: str, params: Any, many: bool, context: Any) -> str:
        seen.append((sql, params, many, context))
        return "rows"

    assert meter(execute, "SELECT 1", (), False, {"c": 1}) == "rows"
    assert meter(execute, "SELECT 2", None, True, {}) == "rows"
    assert seen == [("SELECT 1", (), False, {"c": 1}), ("SELECT 2", None, True, {})]
    assert meter.queries == 2 and meter.seconds >= 0.0


def test_a_failing_query_counts_too():
    meter = QueryMeter()

    def execute(*args: Any) -> None:
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        meter(execute, "SELECT 1", (), False, {})
    assert meter.queries == 1


def test_a_subclass_counts_elsewhere():
    class Seconds(QueryMeter):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def count(self, seconds: float) -> None:
            self.times.append(seconds)

    meter = Seconds()
    meter(lambda *a: None, "SELECT 1", (), False, {})
    assert len(meter.times) == 1 and meter.queries == 0
