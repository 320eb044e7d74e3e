"""A query meter: a database execute wrapper (`connection.execute_wrapper`) that times each
query (execute and transfer, not row building) and counts it.

The scheduler loop counts each query towards the phase that runs it (loop.py); the
benchmarks in bench/ count totals. Importing it needs no Django set up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class QueryMeter:
    """Counts queries and the time spent inside them, in `queries` and `seconds`; a subclass
    counts them elsewhere by overriding `count`."""

    def __init__(self) -> None:
        self.queries = 0
        self.seconds = 0.0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.count(time.perf_counter() - start)

    def count(self, seconds: float) -> None:
        """One query that took `seconds`."""
        self.queries += 1
        self.seconds += seconds
