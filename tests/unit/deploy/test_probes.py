"""Dependency probes and the health watch against real local HTTP servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from aiohttp import web

from printery.deploy.probes import check_dependencies, probe_dependency, watch_health

from .conftest import Serve


class Hits:
    """Counts requests per path, so a test can tell what the probe actually did."""

    def __init__(self) -> None:
        self.by_path: dict[str, int] = {}

    def count(self, request: web.Request) -> int:
        self.by_path[request.path] = self.by_path.get(request.path, 0) + 1
        return self.by_path[request.path]


def health_app(hits: Hits, *, version: str | None = None) -> web.Application:
    """/ok 200, /fail 500, /missing 404, /moved 302 to /ok, /slow sleeps, /version JSON,
    /flaky fails twice then answers 200, /text 200 plain text."""

    async def handle(request: web.Request) -> web.StreamResponse:
        n = hits.count(request)
        path = request.path
        if path == "/ok":
            return web.json_response({"status": "ok"})
        if path == "/fail":
            return web.json_response({"status": "down"}, status=500)
        if path == "/missing":
            return web.Response(status=404)
        if path == "/moved":
            raise web.HTTPFound("/ok")
        if path == "/slow":
            await asyncio.sleep(5)
            return web.Response(text="late")
        if path == "/version":
            return web.json_response({"status": "ok", "version": version})
        if path == "/flaky":
            return web.Response(status=503 if n <= 2 else 200)
        if path == "/flaky-version":
            return web.json_response({"version": "1.4.1" if n <= 2 else version})
        return web.Response(text="fine")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


def dep(url: str, version: str | None = None) -> dict[str, Any]:
    return {"service": "ledger", "health_url": url, "version": version}


async def test_healthy_dependency(serve: Serve, client: httpx.AsyncClient) -> None:
    hits = Hits()
    base = await serve(health_app(hits))
    result = await probe_dependency(client, dep(f"{base}/ok"), timeout=2, retries=2)
    assert result["service"] == "ledger"
    assert result["status"] == "healthy"
    assert isinstance(result["latency_ms"], float)
    assert hits.by_path == {"/ok": 1}


async def test_server_error_is_retried_then_unhealthy(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    hits = Hits()
    base = await serve(health_app(hits))
    result = await probe_dependency(client, dep(f"{base}/fail"), timeout=2, retries=2, backoff_ms=1)
    assert result["status"] == "unhealthy"
    assert "HTTP 500" in result["detail"]
    assert hits.by_path["/fail"] == 3


async def test_client_error_is_not_retried(serve: Serve, client: httpx.AsyncClient) -> None:
    hits = Hits()
    base = await serve(health_app(hits))
    result = await probe_dependency(
        client, dep(f"{base}/missing"), timeout=2, retries=3, backoff_ms=1
    )
    assert result["status"] == "unhealthy"
    assert hits.by_path["/missing"] == 1


async def test_transient_failure_recovers_within_retries(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    hits = Hits()
    base = await serve(health_app(hits))
    result = await probe_dependency(
        client, dep(f"{base}/flaky"), timeout=2, retries=2, backoff_ms=1
    )
    assert result["status"] == "healthy"
    assert hits.by_path["/flaky"] == 3


async def test_closed_port_is_unreachable(client: httpx.AsyncClient, closed_port_url: str) -> None:
    result = await probe_dependency(
        client, dep(closed_port_url), timeout=2, retries=1, backoff_ms=1
    )
    assert result["status"] == "unreachable"
    assert "attempt 2 of 2" in result["detail"]


async def test_slow_dependency_is_unreachable_within_timeout(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    base = await serve(health_app(Hits()))
    started = time.monotonic()
    result = await probe_dependency(client, dep(f"{base}/slow"), timeout=0.2, retries=0)
    assert result["status"] == "unreachable"
    assert "0.2s" in result["detail"]
    assert time.monotonic() - started < 2


async def test_redirect_is_not_followed(serve: Serve, client: httpx.AsyncClient) -> None:
    hits = Hits()
    base = await serve(health_app(hits))
    result = await probe_dependency(client, dep(f"{base}/moved"), timeout=2, retries=2)
    assert result["status"] == "unhealthy"
    assert "redirect" in result["detail"] and "not followed" in result["detail"]
    assert "/ok" not in hits.by_path
    assert hits.by_path["/moved"] == 1


async def test_version_constraint(serve: Serve, client: httpx.AsyncClient) -> None:
    old = await serve(health_app(Hits(), version="1.9.0"))
    new = await serve(health_app(Hits(), version="2.4.1"))
    pre = await serve(health_app(Hits(), version="2.1.0rc1"))
    spec = ">=2.0,<3"

    mismatch = await probe_dependency(client, dep(f"{old}/version", spec), timeout=2, retries=1)
    assert mismatch["status"] == "version_mismatch"
    assert "1.9.0" in mismatch["detail"]
    ok = await probe_dependency(client, dep(f"{new}/version", spec), timeout=2, retries=1)
    assert ok["status"] == "healthy"
    # A running pre-release is "already present" (PEP 440), so it may satisfy the range.
    prerelease = await probe_dependency(client, dep(f"{pre}/version", spec), timeout=2, retries=1)
    assert prerelease["status"] == "healthy"
    unversioned = await probe_dependency(client, dep(f"{new}/ok", spec), timeout=2, retries=1)
    assert unversioned["status"] == "version_mismatch"


async def test_check_dependencies_keeps_order_and_blocks(
    serve: Serve, client: httpx.AsyncClient, closed_port_url: str
) -> None:
    base = await serve(health_app(Hits()))
    deps = [
        {"service": "a", "health_url": f"{base}/ok"},
        {"service": "b", "health_url": closed_port_url},
        {"service": "c", "health_url": f"{base}/ok"},
    ]
    checked = await check_dependencies(client, deps, timeout=2, retries=0, deployment_id="dep-1")
    assert checked["deployment_id"] == "dep-1"
    assert checked["status"] == "blocked"
    assert [r["service"] for r in checked["results"]] == ["a", "b", "c"]
    assert [r["status"] for r in checked["results"]] == ["healthy", "unreachable", "healthy"]

    fine = await check_dependencies(client, [deps[0], deps[2]], timeout=2, retries=0)
    assert fine["status"] == "ok"


async def test_no_dependencies_is_ok(client: httpx.AsyncClient) -> None:
    checked = await check_dependencies(client, [], timeout=1, retries=0, deployment_id="d")
    assert checked == {"deployment_id": "d", "status": "ok", "results": []}


def request(url: str | None, version: str = "1.4.2") -> dict[str, Any]:
    return {"deployment_id": "dep-7", "service": "billing", "version": version, "health_url": url}


async def test_watch_healthy_after_consecutive_successes(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    base = await serve(health_app(Hits(), version="1.4.2"))
    calls: list[int] = []
    result = await watch_health(
        client,
        request(f"{base}/version"),
        interval=0.01,
        consecutive=3,
        deadline=5,
        probe_timeout=1,
        on_probe=lambda: calls.append(1),
    )
    assert result["status"] == "healthy"
    assert result["deployment_id"] == "dep-7"
    assert result["probes"] == 3
    assert result["consecutive_successes"] == 3
    assert result["last_status_code"] == 200
    assert len(calls) == 3


async def test_watch_counts_again_after_a_failure(serve: Serve, client: httpx.AsyncClient) -> None:
    base = await serve(health_app(Hits()))
    result = await watch_health(
        client,
        request(f"{base}/flaky"),
        interval=0.01,
        consecutive=2,
        deadline=5,
        probe_timeout=1,
    )
    assert result["status"] == "healthy"
    assert result["probes"] == 4
    assert result["consecutive_successes"] == 2


async def test_watch_unhealthy_at_deadline(serve: Serve, client: httpx.AsyncClient) -> None:
    base = await serve(health_app(Hits()))
    started = time.monotonic()
    result = await watch_health(
        client,
        request(f"{base}/fail"),
        interval=0.05,
        consecutive=2,
        deadline=0.5,
        probe_timeout=1,
    )
    elapsed = time.monotonic() - started
    assert result["status"] == "unhealthy"
    assert result["last_status_code"] == 500
    assert result["consecutive_successes"] == 0
    assert 2 <= result["probes"] <= 12
    assert 0.45 <= elapsed < 1.5
    assert "0.5s" in result["detail"]


async def test_watch_deadline_bounds_a_slow_probe(serve: Serve, client: httpx.AsyncClient) -> None:
    base = await serve(health_app(Hits()))
    started = time.monotonic()
    result = await watch_health(
        client,
        request(f"{base}/slow"),
        interval=0.05,
        consecutive=1,
        deadline=0.3,
        probe_timeout=5,
    )
    assert result["status"] == "unhealthy"
    assert result["last_status_code"] is None
    assert time.monotonic() - started < 1.5


async def test_old_version_is_not_healthy(serve: Serve, client: httpx.AsyncClient) -> None:
    base = await serve(health_app(Hits(), version="1.4.1"))
    result = await watch_health(
        client,
        request(f"{base}/version"),
        interval=0.05,
        consecutive=1,
        deadline=0.5,
        probe_timeout=1,
    )
    assert result["status"] == "unhealthy"
    assert result["last_status_code"] == 200
    assert "1.4.1" in result["detail"]


async def test_new_version_rolling_out_becomes_healthy(
    serve: Serve, client: httpx.AsyncClient
) -> None:
    base = await serve(health_app(Hits(), version="1.4.2"))
    result = await watch_health(
        client,
        request(f"{base}/flaky-version"),
        interval=0.01,
        consecutive=2,
        deadline=5,
        probe_timeout=1,
    )
    assert result["status"] == "healthy"
    assert result["probes"] == 4


async def test_plain_text_2xx_is_a_success(serve: Serve, client: httpx.AsyncClient) -> None:
    base = await serve(health_app(Hits()))
    result = await watch_health(
        client,
        request(f"{base}/text"),
        interval=0.01,
        consecutive=2,
        deadline=5,
        probe_timeout=1,
    )
    assert result["status"] == "healthy"


async def test_unreachable_service_is_unhealthy(
    client: httpx.AsyncClient, closed_port_url: str
) -> None:
    result = await watch_health(
        client,
        request(closed_port_url),
        interval=0.05,
        consecutive=1,
        deadline=0.3,
        probe_timeout=1,
    )
    assert result["status"] == "unhealthy"
    assert result["last_status_code"] is None
    assert result["probes"] >= 1


async def test_no_health_url_is_skipped(client: httpx.AsyncClient) -> None:
    calls: list[int] = []
    result = await watch_health(
        client,
        request(None),
        interval=0.01,
        consecutive=3,
        deadline=1,
        probe_timeout=1,
        on_probe=lambda: calls.append(1),
    )
    assert result == {
        "deployment_id": "dep-7",
        "status": "skipped",
        "probes": 0,
        "consecutive_successes": 0,
        "last_status_code": None,
        "detail": "no health_url",
    }
    assert calls == []
