"""The CLI's client waits as the server asks (429/503 + Retry-After) and gives up cleanly."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from berth.cli.client import ApiError, Client, CliError, Settings


def client_with(responses: list[httpx.Response], monkeypatch: pytest.MonkeyPatch,
                retries: int = 6) -> tuple[Client, list[float], list[httpx.Request]]:  # fmt: skip
    sleeps: list[float] = []
    seen: list[httpx.Request] = []
    monkeypatch.setattr("berth.cli.client.time.sleep", sleeps.append)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses.pop(0)

    client = Client(Settings("http://berth.test", "tok"), retries=retries)
    client.http = httpx.Client(base_url="http://berth.test",
                               transport=httpx.MockTransport(handler))  # fmt: skip
    return client, sleeps, seen


def test_it_waits_the_servers_retry_after_then_sends_again(monkeypatch: Any) -> None:
    busy = [httpx.Response(503, headers={"Retry-After": "3"}),
            httpx.Response(429, headers={"Retry-After": "1"})]  # fmt: skip
    client, sleeps, seen = client_with([*busy, httpx.Response(201, json={"id": 7})], monkeypatch)
    assert client.post("jobs/", {"name": "x"}) == {"id": 7}
    assert len(seen) == 3
    assert 3.0 <= sleeps[0] <= 3.6 and 1.0 <= sleeps[1] <= 1.2  # as asked, plus jitter


def test_it_gives_up_after_its_retries_with_the_servers_message(monkeypatch: Any) -> None:
    busy = [httpx.Response(503, headers={"Retry-After": "1"},
                           json={"detail": "database busy, retry"}) for _ in range(3)]  # fmt: skip
    client, sleeps, _ = client_with(busy, monkeypatch, retries=2)
    with pytest.raises(ApiError) as refused:
        client.get("jobs/")
    assert refused.value.status == 503 and refused.value.messages == ["database busy, retry"]
    assert len(sleeps) == 2


def test_a_refused_connection_is_retried_then_reported(monkeypatch: Any) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("berth.cli.client.time.sleep", sleeps.append)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = Client(Settings("http://berth.test", "tok"), retries=3)
    client.http = httpx.Client(base_url="http://berth.test", transport=httpx.MockTransport(refuse))
    with pytest.raises(CliError, match="cannot reach http://berth.test"):
        client.get("jobs/")
    assert len(sleeps) == 3
