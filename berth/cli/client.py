"""The CLI's side of the REST API: where the server is, who you are, and the waits the server
asks for. No Django here: the CLI runs on users' machines with only click and httpx."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

# The agents' back-pressure rules (Retry-After in seconds or as a date, bounded, with jitter):
# one implementation, Django-free.
from scheduler.agent.client import Backoff, parse_retry_after

API = "/api/v1"
RETRY_STATUSES = {429, 503}  # the server said "not now": nothing was done, try again later


class CliError(Exception):
    """Something to tell the user; the CLI prints it and exits 1."""


class ApiError(CliError):
    """The server refused the request; `messages` are its field messages, one per line."""

    def __init__(self, status: int, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.status = status
        self.messages = messages


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "berth" / "config.json"


@dataclass
class Settings:
    url: str
    token: str
    username: str = ""


def load_settings() -> Settings:
    """BERTH_URL and BERTH_TOKEN win over what `berth login` saved."""
    saved: dict[str, Any] = {}
    path = config_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read {path}: {exc}") from None
    url = os.environ.get("BERTH_URL") or saved.get("url") or ""
    token = os.environ.get("BERTH_TOKEN") or saved.get("token") or ""
    if not url or not token:
        raise CliError("not logged in: run `berth login URL`, or set BERTH_URL and BERTH_TOKEN")
    username = "" if os.environ.get("BERTH_TOKEN") else str(saved.get("username", ""))
    return Settings(url=url.rstrip("/"), token=token, username=username)


def save_settings(settings: Settings) -> Path:
    """Keep the login in the user's config dir, readable by them alone (0600, dir 0700)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": settings.url, "token": settings.token,
                   "username": settings.username}, out)  # fmt: skip
    os.chmod(tmp, 0o600)  # O_CREAT's mode is masked by umask and ignored for an old file
    os.replace(tmp, path)
    return path


def flatten_errors(data: Any, prefix: str = "") -> list[str]:
    """DRF's nested error body -> ["tasks.0.resources.gpu: must be a whole number", ...]."""
    if isinstance(data, dict):
        out: list[str] = []
        for key, value in data.items():
            path = str(key) if not prefix else f"{prefix}.{key}"
            if key in ("detail", "non_field_errors") and not prefix:
                path = ""
            out.extend(flatten_errors(value, path))
        return out
    if isinstance(data, list):
        if all(isinstance(item, str) for item in data):
            return [f"{prefix}: {item}" if prefix else item for item in data]
        return [line for i, item in enumerate(data) for line in
                flatten_errors(item, f"{prefix}.{i}" if prefix else str(i))]  # fmt: skip
    return [f"{prefix}: {data}" if prefix else str(data)]


class Client:
    def __init__(self, settings: Settings, retries: int = 6, timeout: float = 30.0) -> None:
        self.settings = settings
        self.retries = retries
        self.http = httpx.Client(
            base_url=settings.url,
            timeout=timeout,
            headers={"Authorization": f"Token {settings.token}", "Accept": "application/json"},
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API call; waits and retries on 429/503 and on refused connections (nothing
        reached the server), never on a timeout after sending (it may have been done)."""
        url = path if path.startswith("/") else f"{API}/{path}"
        backoff = Backoff(base=0.5, cap=30.0)
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, url, **kwargs)
            except httpx.ConnectError as exc:
                if attempt == self.retries:
                    raise CliError(f"cannot reach {self.settings.url}: {exc}") from None
                time.sleep(backoff.delay())
                continue
            except httpx.HTTPError as exc:
                raise CliError(f"{method} {url}: {exc}") from None
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                time.sleep(backoff.delay(parse_retry_after(response.headers.get("Retry-After"))))
                continue
            if response.status_code >= 400:
                raise api_error(response)
            return response
        raise AssertionError("unreachable")

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A GET whose body is read piece by piece (a whole log); waits and retries like
        `request` until the body starts."""
        clean = {k: v for k, v in params.items() if v is not None}
        backoff = Backoff(base=0.5, cap=30.0)
        for attempt in range(self.retries + 1):
            wait = backoff.delay()
            try:
                with self.http.stream("GET", f"{API}/{path}", params=clean) as response:
                    if response.status_code in RETRY_STATUSES and attempt < self.retries:
                        wait = backoff.delay(parse_retry_after(response.headers.get("Retry-After")))
                    elif response.status_code >= 400:
                        response.read()
                        raise api_error(response)
                    else:
                        yield from response.iter_bytes()
                        return
            except httpx.ConnectError as exc:
                if attempt == self.retries:
                    raise CliError(f"cannot reach {self.settings.url}: {exc}") from None
            except httpx.HTTPError as exc:
                raise CliError(f"GET {path}: {exc}") from None
            time.sleep(wait)
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean).json()

    def post(self, path: str, body: Any = None) -> Any:
        response = self.request("POST", path, json=body)
        return response.json() if response.content else None

    def paged(self, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
        """Every row of a paginated listing (or the first `limit`)."""
        rows: list[dict[str, Any]] = []
        page = 1
        while True:
            data = self.get(path, page=page, page_size=500, **params)
            if isinstance(data, list):
                return data[:limit] if limit else data
            rows.extend(data.get("results", []))
            if not data.get("next") or (limit and len(rows) >= limit):
                return rows[:limit] if limit else rows
            page += 1


def api_error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = response.text.strip()[:500] or response.reason_phrase
    messages = flatten_errors(body) or [response.reason_phrase]
    return ApiError(response.status_code, messages)
