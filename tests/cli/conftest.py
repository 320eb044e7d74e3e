"""The CLI's live tests use the end-to-end cluster: a live server, the loop and a real agent.
The others run the CLI in this process: `berth` wires its HTTP client straight into the Django
app, no server (a module with a `berth` fixture of its own uses that one instead)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from rest_framework.test import APIClient

from berth.cli.client import Client, Settings
from berth.cli.main import cli
from tests.e2e.conftest import cluster, token  # noqa: F401 - fixtures


@pytest.fixture
def berth(owner: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """berth(*args) -> click's result of running the CLI as `owner`."""
    api = APIClient()
    api.force_authenticate(owner)

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.content.decode()
        answer = api.generic(request.method, request.url.raw_path.decode(), body,
                             content_type="application/json")  # fmt: skip
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"Content-Type": answer.get("Content-Type", "")})  # fmt: skip

    def make_client() -> Client:
        made = Client(Settings("http://berth.test", "tok"), retries=0)
        made.http = httpx.Client(base_url="http://berth.test",
                                 transport=httpx.MockTransport(handler))  # fmt: skip
        return made

    monkeypatch.setattr("berth.cli.main.client", make_client)
    return lambda *args: CliRunner().invoke(cli, list(args))
