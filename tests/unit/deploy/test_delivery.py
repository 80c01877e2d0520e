"""Channel parsing, redaction, signing and webhook delivery against a real local sink."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from printery.deploy.delivery import (
    Channel,
    DeliveryResult,
    parse_channel,
    post_webhook,
    redact_channel,
    sign,
)

from .conftest import Serve

SECRET = "s3cret"
PAYLOAD: dict[str, Any] = {"deployment_id": "dep-1", "status": "succeeded", "reasons": []}


@dataclass
class Sink:
    """A webhook receiver that records what it got and verifies signatures itself."""

    fail_first: int = 0
    status_on_failure: int = 500
    received: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        signature = request.headers.get("X-Printery-Signature")
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        self.received.append(
            {
                "body": body,
                "key": request.headers.get("X-Printery-Idempotency-Key"),
                "signature": signature,
                "verified": signature is not None and hmac.compare_digest(signature, expected),
                "content_type": request.headers.get("Content-Type"),
            }
        )
        if len(self.received) <= self.fail_first:
            return web.Response(status=self.status_on_failure)
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hooks/deploy", self.handle)
        return app


async def deliver(client: httpx.AsyncClient, url: str, key: str, **options: Any) -> DeliveryResult:
    """``post_webhook`` of PAYLOAD with idempotency key ``key``: no secret, no retries, a
    1 ms backoff and a 2 s timeout unless ``options`` say otherwise."""
    settings: dict[str, Any] = {"secret": None, "retries": 0, "backoff_ms": 1, "timeout": 2, **options}
    return await post_webhook(client, url, PAYLOAD, idempotency_key=key, **settings)


@pytest.mark.parametrize(
    ("sink", "secret", "retries", "outcome", "detail"),
    [
        pytest.param(Sink, SECRET, 3, ("delivered", 1, 204), "", id="delivered-with-verified-signature"),
        pytest.param(Sink, None, 0, ("delivered", 1, 204), "", id="no-secret-means-no-signature"),
        pytest.param(
            lambda: Sink(fail_first=100), SECRET, 3, ("failed", 4, 500), "HTTP 500",
            id="failing-sink-gets-every-attempt-with-the-same-key",
        ),
        pytest.param(
            lambda: Sink(fail_first=2, status_on_failure=503), None, 3, ("delivered", 3, 204), "",
            id="recovers-within-retries",
        ),
    ],
)
async def test_delivery_to_a_sink(
    serve: Serve,
    client: httpx.AsyncClient,
    sink: Callable[[], Sink],
    secret: str | None,
    retries: int,
    outcome: tuple[str, int, int],
    detail: str,
) -> None:
    """Every attempt reaches the sink with the same key, the same bytes (serialized once)
    and the JSON content type; signed (and verifiable) exactly when there is a secret."""
    receiver = sink()
    base = await serve(receiver.app())
    result = await deliver(client, f"{base}/hooks/deploy", "k-1", secret=secret, retries=retries)
    assert (result.status, result.attempts, result.status_code) == outcome
    assert detail in result.detail
    assert len(receiver.received) == result.attempts
    assert {got["key"] for got in receiver.received} == {"k-1"}
    assert {got["body"] for got in receiver.received} == {receiver.received[0]["body"]}
    assert json.loads(receiver.received[0]["body"]) == PAYLOAD
    assert {got["content_type"] for got in receiver.received} == {"application/json"}
    assert all(got["verified"] is (secret is not None) for got in receiver.received)
    assert all((got["signature"] is None) is (secret is None) for got in receiver.received)


async def test_unreachable_receiver_fails_after_all_attempts(
    client: httpx.AsyncClient, closed_port_url: str
) -> None:
    result = await deliver(client, closed_port_url, "k-5", retries=2)
    assert (result.status, result.attempts, result.status_code) == ("failed", 3, None)


async def test_host_outside_allowlist_is_refused_without_a_request(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    sink = Sink()
    base = await serve(sink.app())
    url = f"{base}/hooks/deploy"
    result = await deliver(client, url, "k-6", retries=3, allow_hosts=("hooks.example.com",))
    assert (result.status, result.attempts, result.detail) == ("failed", 0, "host not allowed")
    assert sink.received == []

    allowed = await deliver(client, url, "k-6", allow_hosts=("127.0.0.1",))
    assert allowed.status == "delivered"


async def test_redirect_is_not_followed(serve: Serve, client: httpx.AsyncClient) -> None:
    sink = Sink()

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/hooks/deploy")

    app = sink.app()
    app.router.add_post("/old", moved)
    base = await serve(app)
    result = await deliver(client, f"{base}/old", "k-7", retries=1)
    assert (result.status, result.status_code) == ("failed", 307)
    assert sink.received == []


async def test_response_is_read_only_up_to_the_limit(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    """An endless 200 answer: reading it all would never end; the limit makes it quick."""
    sent: list[int] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        chunk = b"x" * 4096
        try:
            while True:
                await response.write(chunk)
                sent.append(len(chunk))
                await asyncio.sleep(0.001)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    app = web.Application()
    app.router.add_post("/hooks/deploy", endless)
    base = await serve(app)
    started = time.monotonic()
    result = await deliver(client, f"{base}/hooks/deploy", "k-8", timeout=10, max_response_bytes=16384)
    assert result.status == "delivered"
    assert time.monotonic() - started < 3


async def test_slow_receiver_times_out_per_attempt(serve: Serve, client: httpx.AsyncClient) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hooks/deploy", slow)
    base = await serve(app)
    started = time.monotonic()
    result = await deliver(client, f"{base}/hooks/deploy", "k-9", retries=1, timeout=0.2)
    assert (result.status, result.attempts) == ("failed", 2)
    assert "timed out" in result.detail
    assert time.monotonic() - started < 2


def test_sign_is_hex_hmac_sha256() -> None:
    body = b'{"a":1}'
    assert sign(body, "key") == "sha256=" + hmac.new(b"key", body, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        ("log", Channel(kind="log")),
        ("webhook+http://127.0.0.1:9000/hooks", Channel("webhook", "http://127.0.0.1:9000/hooks")),
        (
            "webhook+https://u:p@hooks.example.com/x",
            Channel("webhook", "https://u:p@hooks.example.com/x"),
        ),
    ],
)
def test_parse_channel(channel: str, expected: Channel) -> None:
    assert parse_channel(channel) == expected


@pytest.mark.parametrize(
    ("channel", "message"),
    [
        ("", "unknown channel"),
        ("email:ops@example.com", "unknown channel"),
        ("webhook+ftp://example.com/x", "http or https"),
        ("webhook+http://", "host"),
        ("webhook+https://u:hunter2@exa mple.com/", "whitespace"),
        ("LOG", "unknown channel"),
    ],
)
def test_parse_channel_rejects(channel: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_channel(channel)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("channel", "shown"),
    [
        ("log", "log"),
        ("webhook+https://user:pw@hooks.example.com/x", "webhook+https://***@hooks.example.com/x"),
        (
            "webhook+https://hooks.example.com/x?token=abc&v=1",
            "webhook+https://hooks.example.com/x?token=***&v=1",
        ),
        ("webhook+http://127.0.0.1:9000/hooks", "webhook+http://127.0.0.1:9000/hooks"),
        ("webhook+http://u:p@[::1/x", "webhook+http://***@[::1/x"),
    ],
)
def test_redact_channel(channel: str, shown: str) -> None:
    assert redact_channel(channel) == shown
