"""The HTTP endpoint, served for real on 127.0.0.1 and queried with httpx
(docs/reference.md, HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from printery.observe.metrics import Metrics
from printery.service.http import HttpServer, StatusProvider


class FakeProvider:
    """A provider whose answers the tests steer."""

    def __init__(self) -> None:
        self.metrics_registry = Metrics(process_metrics=False)
        self.ready = True
        self.reasons: list[str] = []
        self.hang = False
        self.fail = False

    async def status(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("redis://:hunter2@db is down")
        return {
            "process": {
                "host": "h", "pid": 1, "started_at": "2026-01-01T00:00:00.000Z",
                "worker_mode": "all", "supervised": False, "environment": "development",
            },
            "redis": {"connected": True, "url": "redis://:***@db:6379"},
            "workers": {
                "validator": {
                    "state": "running", "healthy": True, "uptime_s": 1.5, "restarts": 0,
                    "errors": 0, "processed": 4, "consumers": 1, "pending": 0,
                    "last_error": None,
                }
            },
        }

    async def readiness(self) -> tuple[bool, list[str]]:
        if self.hang:
            await asyncio.sleep(30)
        return self.ready, self.reasons

    def metrics(self) -> bytes:
        return self.metrics_registry.render()


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
async def client(provider: FakeProvider) -> AsyncIterator[httpx.AsyncClient]:
    checked: StatusProvider = provider  # the fake satisfies the Protocol
    server = HttpServer(checked, probe_timeout=0.3)
    port = await server.start("127.0.0.1", 0)
    assert port > 0 and server.port == port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        yield http
    await server.stop()
    await server.stop()  # idempotent


async def test_healthz(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["content-type"].startswith("application/json")


async def test_readyz_ready_and_unavailable(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (200, {"status": "ready"})

    provider.ready, provider.reasons = False, ["redis not answering", "notifier unhealthy"]
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable", "reasons": ["redis not answering", "notifier unhealthy"],
    }


async def test_readyz_hanging_provider_is_503_not_a_hung_probe(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    provider.hang = True
    response = await client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert "timed out" in body["reasons"][0]


async def test_status_document(client: httpx.AsyncClient) -> None:
    response = await client.get("/status")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"process", "redis", "workers"}
    assert body["workers"]["validator"]["state"] == "running"


async def test_status_failure_is_json_500_without_secrets(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    provider.fail = True
    response = await client.get("/status")
    assert response.status_code == 500
    assert response.json()["error"] == "internal"
    assert "hunter2" not in response.text


async def test_metrics(client: httpx.AsyncClient, provider: FakeProvider) -> None:
    provider.metrics_registry.observe_message("validator", "ok", 0.01)
    provider.metrics_registry.set_worker("validator", up=True, uptime_s=2)
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {f.name for f in text_string_to_metric_families(response.text)}
    assert {"printery_messages", "printery_processing_seconds", "printery_worker_up"} <= families
    assert 'printery_messages_total{outcome="ok",worker="validator"} 1.0' in response.text


async def test_unknown_path_is_json_404(client: httpx.AsyncClient) -> None:
    """Every error answer has the API's shape, ``{"error", "detail"}`` (docs/reference.md,
    The API: /v1)."""
    response = await client.get("/nope")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"error": "not_found", "detail": "no route GET /nope"}


async def test_wrong_method_is_json_405(client: httpx.AsyncClient) -> None:
    response = await client.post("/healthz")
    assert response.status_code == 405
    assert "GET" in response.headers["allow"]
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == "method_not_allowed"
    assert body["detail"].startswith("POST is not allowed on /healthz; allowed: ")


async def test_a_failing_status_is_an_error_of_the_api_shape(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    provider.fail = True
    failed = (await client.get("/status")).json()
    assert set(failed) == {"error", "detail"}


async def test_start_twice_and_port_in_use(provider: FakeProvider) -> None:
    first = HttpServer(provider)
    port = await first.start("127.0.0.1", 0)
    try:
        with pytest.raises(RuntimeError):
            await first.start("127.0.0.1", 0)
        with pytest.raises(OSError):
            await HttpServer(provider).start("127.0.0.1", port)
    finally:
        await first.stop()
