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

BUSY = (429, 503)
# Berth refuses keys under 50 characters when not debugging; this one is public: bench only.
BENCH_SECRET_KEY = "bench-only-secret-key-never-in-production-0123456789abcdef"
MAX_WAIT_SECONDS = 10.0


def retry_after(value: str | None, attempt: int) -> float:
    """Seconds to wait: the server's Retry-After when it is a number, else backing off."""
    try:
        seconds = float(value) if value is not None else -1.0
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        seconds = 0.5 * 2**attempt
    return min(seconds, MAX_WAIT_SECONDS)


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
                time.sleep(retry_after(error.headers.get("Retry-After"), attempt))
                attempt += 1
                continue
            return error.code, _decode(error.read())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
