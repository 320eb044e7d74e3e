"""HTTP for bench clients: JSON in and out, and back-pressure honoured.

A server that is saturated answers 429 or 503 with Retry-After; a polite client waits that
long (capped) and tries again, a bounded number of times, then reports the last status.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from scheduler.agent.client import Backoff, parse_retry_after

BUSY = (429, 503)
# Berth refuses keys under 50 characters when not debugging; this one is public: bench only.
BENCH_SECRET_KEY = "bench-only-secret-key-never-in-production-0123456789abcdef"


def post_json(
    url: str,
    data: Any,
    headers: dict[str, str],
    method: str = "POST",
    retries: int = 5,
    timeout: float = 60.0,
) -> tuple[int, Any]:
    """Send `data` as JSON (None: no body) and return (status, decoded body or text).

    429/503 are retried up to `retries` times after their Retry-After; connection errors
    are raised, other statuses returned as they are."""
    body = None if data is None else json.dumps(data).encode()
    attempt = 0
    backoff = Backoff(base=0.5, cap=10.0)
    while True:
        request = urllib.request.Request(
            url, data=body, method=method,
            headers={**headers, "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, _decode(response.read())
        except urllib.error.HTTPError as error:
            if error.code in BUSY and attempt < retries:
                time.sleep(backoff.delay(parse_retry_after(error.headers.get("Retry-After"))))
                attempt += 1
                continue
            return error.code, _decode(error.read())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
