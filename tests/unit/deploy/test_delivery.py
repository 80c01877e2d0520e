"""Channel parsing, redaction, signing and webhook delivery against a real local sink."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from printery.deploy.delivery import (
    Channel,
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


async def test_delivered_with_headers_and_verified_signature(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    sink = Sink()
    base = await serve(sink.app())
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-1",
        secret=SECRET,
        retries=3,
        backoff_ms=1,
        timeout=2,
    )
    assert (result.status, result.attempts, result.status_code) == ("delivered", 1, 204)
    [got] = sink.received
    assert got["verified"] is True
    assert got["key"] == "k-1"
    assert got["content_type"] == "application/json"
    assert json.loads(got["body"]) == PAYLOAD


async def test_no_secret_means_no_signature(serve: Serve, client: httpx.AsyncClient) -> None:
    sink = Sink()
    base = await serve(sink.app())
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-2",
        secret=None,
        retries=0,
        backoff_ms=1,
        timeout=2,
    )
    assert result.status == "delivered"
    assert sink.received[0]["signature"] is None


async def test_failing_sink_gets_every_attempt_with_the_same_key(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    sink = Sink(fail_first=100)
    base = await serve(sink.app())
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-3",
        secret=SECRET,
        retries=3,
        backoff_ms=1,
        timeout=2,
    )
    assert result.status == "failed"
    assert result.attempts == 4
    assert result.status_code == 500
    assert "HTTP 500" in result.detail
    assert len(sink.received) == 4
    assert {got["key"] for got in sink.received} == {"k-3"}
    # Serialized once: identical bytes and signature on every attempt.
    assert len({got["body"] for got in sink.received}) == 1
    assert all(got["verified"] for got in sink.received)


async def test_recovers_within_retries(serve: Serve, client: httpx.AsyncClient) -> None:
    sink = Sink(fail_first=2, status_on_failure=503)
    base = await serve(sink.app())
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-4",
        secret=None,
        retries=3,
        backoff_ms=1,
        timeout=2,
    )
    assert (result.status, result.attempts) == ("delivered", 3)


async def test_unreachable_receiver_fails_after_all_attempts(
    client: httpx.AsyncClient, closed_port_url: str
) -> None:
    result = await post_webhook(
        client,
        closed_port_url,
        PAYLOAD,
        idempotency_key="k-5",
        secret=None,
        retries=2,
        backoff_ms=1,
        timeout=2,
    )
    assert (result.status, result.attempts, result.status_code) == ("failed", 3, None)


async def test_host_outside_allowlist_is_refused_without_a_request(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    sink = Sink()
    base = await serve(sink.app())
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-6",
        secret=None,
        retries=3,
        backoff_ms=1,
        timeout=2,
        allow_hosts=("hooks.example.com",),
    )
    assert (result.status, result.attempts, result.detail) == ("failed", 0, "host not allowed")
    assert sink.received == []

    allowed = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-6",
        secret=None,
        retries=0,
        backoff_ms=1,
        timeout=2,
        allow_hosts=("127.0.0.1",),
    )
    assert allowed.status == "delivered"


async def test_redirect_is_not_followed(serve: Serve, client: httpx.AsyncClient) -> None:
    sink = Sink()

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/hooks/deploy")

    app = sink.app()
    app.router.add_post("/old", moved)
    base = await serve(app)
    result = await post_webhook(
        client,
        f"{base}/old",
        PAYLOAD,
        idempotency_key="k-7",
        secret=None,
        retries=1,
        backoff_ms=1,
        timeout=2,
    )
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
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-8",
        secret=None,
        retries=0,
        backoff_ms=1,
        timeout=10,
        max_response_bytes=16384,
    )
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
    result = await post_webhook(
        client,
        f"{base}/hooks/deploy",
        PAYLOAD,
        idempotency_key="k-9",
        secret=None,
        retries=1,
        backoff_ms=1,
        timeout=0.2,
    )
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
