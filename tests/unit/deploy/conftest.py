"""Real local HTTP servers for the probe and delivery tests: no HTTP is mocked."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from aiohttp import web

Serve = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an aiohttp app on 127.0.0.1, an ephemeral port; yields its base URL.

    A short shutdown timeout keeps teardown bounded even when a handler still streams
    or sleeps (the slow-server tests leave such handlers behind on purpose).
    """
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The shared client callers pass in; proxies from the environment are ignored."""
    async with httpx.AsyncClient(trust_env=False) as http:
        yield http


@pytest.fixture
def closed_port_url() -> str:
    """A URL on a port nothing listens on: bound, then released, so it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/healthz"
