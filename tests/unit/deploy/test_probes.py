"""Dependency probes and the health watch against real local HTTP servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
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


@pytest.mark.parametrize(
    ("path", "timeout", "retries", "status", "details", "hits"),
    [
        pytest.param("/ok", 2, 2, "healthy", [], {"/ok": 1}, id="healthy"),
        pytest.param(
            "/fail", 2, 2, "unhealthy", ["HTTP 500"], {"/fail": 3},
            id="server-error-is-retried-then-unhealthy",
        ),
        pytest.param("/missing", 2, 3, "unhealthy", [], {"/missing": 1}, id="client-error-is-not-retried"),
        pytest.param(
            "/flaky", 2, 2, "healthy", [], {"/flaky": 3}, id="transient-failure-recovers-within-retries"
        ),
        pytest.param(None, 2, 1, "unreachable", ["attempt 2 of 2"], {}, id="closed-port-is-unreachable"),
        pytest.param(
            "/slow", 0.2, 0, "unreachable", ["0.2s"], {"/slow": 1},
            id="slow-dependency-is-unreachable-within-timeout",
        ),
        pytest.param(
            "/moved", 2, 2, "unhealthy", ["redirect", "not followed"], {"/moved": 1},
            id="redirect-is-not-followed",
        ),
    ],
)
async def test_probe_dependency(
    serve: Serve,
    client: httpx.AsyncClient,
    closed_port_url: str,
    path: str | None,
    timeout: float,
    retries: int,
    status: str,
    details: list[str],
    hits: dict[str, int],
) -> None:
    """One probe against a local server's ``path`` (None: a closed port): its status, the
    words its detail must carry, and exactly which requests the server saw (retries)."""
    counted = Hits()
    base = await serve(health_app(counted))
    url = closed_port_url if path is None else f"{base}{path}"
    started = time.monotonic()
    result = await probe_dependency(client, dep(url), timeout=timeout, retries=retries, backoff_ms=1)
    assert result["service"] == "ledger"
    assert result["status"] == status
    assert isinstance(result["latency_ms"], float)
    for words in details:
        assert words in result["detail"]
    assert counted.by_path == hits
    # Not a speed check: /slow answers after 5 s, so finishing well before that shows the
    # timeout bounded the probe (with ample slack for a loaded machine).
    assert time.monotonic() - started < 4


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


@pytest.mark.parametrize(
    ("version", "path", "consecutive", "probes"),
    [
        pytest.param("1.4.2", "/version", 3, 3, id="healthy-after-consecutive-successes"),
        pytest.param(None, "/flaky", 2, 4, id="counts-again-after-a-failure"),
        pytest.param("1.4.2", "/flaky-version", 2, 4, id="new-version-rolling-out-becomes-healthy"),
        pytest.param(None, "/text", 2, 2, id="plain-text-2xx-is-a-success"),
    ],
)
async def test_watch_becomes_healthy(
    serve: Serve,
    client: httpx.AsyncClient,
    version: str | None,
    path: str,
    consecutive: int,
    probes: int,
) -> None:
    """Healthy once ``consecutive`` probes in a row succeed, after ``probes`` in all."""
    base = await serve(health_app(Hits(), version=version))
    calls: list[int] = []
    result = await watch_health(
        client,
        request(f"{base}{path}"),
        interval=0.01,
        consecutive=consecutive,
        deadline=5,
        probe_timeout=1,
        on_probe=lambda: calls.append(1),
    )
    assert result["status"] == "healthy"
    assert result["deployment_id"] == "dep-7"
    assert result["probes"] == probes
    assert result["consecutive_successes"] == consecutive
    assert result["last_status_code"] == 200
    assert len(calls) == probes


@pytest.mark.parametrize(
    ("version", "path", "consecutive", "deadline", "probe_timeout", "status_code", "min_probes", "details"),
    [
        pytest.param(None, "/fail", 2, 0.5, 1, 500, 2, [], id="unhealthy-at-deadline"),
        pytest.param(None, "/slow", 1, 0.3, 5, None, 1, [], id="deadline-bounds-a-slow-probe"),
        pytest.param("1.4.1", "/version", 1, 0.5, 1, 200, 1, ["1.4.1"], id="old-version-is-not-healthy"),
        pytest.param(None, None, 1, 0.3, 1, None, 1, [], id="unreachable-service-is-unhealthy"),
    ],
)
async def test_watch_unhealthy_at_deadline(
    serve: Serve,
    client: httpx.AsyncClient,
    closed_port_url: str,
    version: str | None,
    path: str | None,
    consecutive: int,
    deadline: float,
    probe_timeout: float,
    status_code: int | None,
    min_probes: int,
    details: list[str],
) -> None:
    """Never healthy (``path`` None: a closed port): unhealthy once the deadline passes,
    which bounds the watch even while a probe is still waiting for its answer."""
    base = await serve(health_app(Hits(), version=version))
    started = time.monotonic()
    result = await watch_health(
        client,
        request(closed_port_url if path is None else f"{base}{path}"),
        interval=0.05,
        consecutive=consecutive,
        deadline=deadline,
        probe_timeout=probe_timeout,
    )
    elapsed = time.monotonic() - started
    assert result["status"] == "unhealthy"
    assert result["last_status_code"] == status_code
    assert result["consecutive_successes"] == 0
    assert min_probes <= result["probes"] <= 12
    # The deadline bounds the watch: /slow would hold a probe for 5 s (probe_timeout 5).
    assert 0.9 * deadline <= elapsed < 4
    for words in [f"{deadline:g}s", *details]:
        assert words in result["detail"]


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
