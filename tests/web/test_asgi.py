"""The ASGI application's guards: body size before Django reads it, in-flight requests per
process, and websocket paths nobody serves."""

from __future__ import annotations

import json

import pytest
from channels.testing import HttpCommunicator, WebsocketCommunicator

from berth.asgi import application
from dashboard.routing import UNKNOWN_PATH_CLOSE_CODE

ORIGIN = (b"origin", b"http://127.0.0.1")


async def post(path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> dict:
    communicator = HttpCommunicator(application, "POST", path, body=body, headers=headers)
    return await communicator.get_response(timeout=10)


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_refused_413_before_django_reads_it(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = b"{" + b" " * 2048 + b"}"
    response = await post(
        "/api/v1/jobs/", body,
        [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    )  # fmt: skip
    assert response["status"] == 413
    assert "BERTH_MAX_BODY_BYTES" in json.loads(response["body"])["detail"]


@pytest.mark.asyncio
async def test_a_chunked_body_over_the_limit_is_refused_413(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    # No Content-Length: the size is only known while reading.
    response = await post("/accounts/login/", b"x" * 2048, [(b"content-type", b"text/plain")])
    assert response["status"] == 413


@pytest.mark.asyncio
async def test_a_chunked_body_within_the_limit_reaches_django(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = await post(
        "/api/v1/jobs/", b"{}", [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
    )
    assert response["status"] == 401  # DRF's answer: the body got through


@pytest.mark.asyncio
async def test_requests_past_the_in_flight_limit_get_503_with_retry_after(settings):
    settings.BERTH_MAX_INFLIGHT = 1
    held = HttpCommunicator(application, "GET", "/accounts/login/")
    # A request whose body never finishes arriving stays in flight.
    await held.send_input({"type": "http.request", "body": b"", "more_body": True})
    try:
        response = await HttpCommunicator(application, "GET", "/accounts/login/").get_response()
        assert response["status"] == 503
        assert dict(response["headers"])[b"retry-after"] == b"1"
    finally:
        await held.send_input({"type": "http.disconnect"})
        await held.wait(timeout=5)


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/jobs/abc/", "/anything"])
async def test_an_unknown_websocket_path_is_closed_cleanly(path):
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN])
    connected, code = await communicator.connect(timeout=5)
    assert (connected, code) == (False, UNKNOWN_PATH_CLOSE_CODE)
