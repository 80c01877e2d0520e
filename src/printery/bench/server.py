"""The server a benchmark measures: the one of ``--redis-url``, else a private one.

Every bench mode (the pipeline run, ``--submit``, ``--console``) runs against the
server it is given, or, given none, against a private server started for the run in a
temporary directory, without persistence (so the disk is not measured), and stopped
however the run ends. One context manager, so the modes cannot differ in how.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from printery.servers.embedded import start_ephemeral

__all__ = ["BenchServer", "bench_server"]


@dataclass(frozen=True, slots=True)
class BenchServer:
    """Where the bench connects (``url``), and the process of a private server (``pid``;
    None when the server was given, so its CPU is not ours to read)."""

    url: str
    pid: int | None


@contextlib.asynccontextmanager
async def bench_server(redis_url: str | None) -> AsyncIterator[BenchServer]:
    """The server of ``redis_url``; with None, a private one for as long as this lasts."""
    if redis_url is not None:
        yield BenchServer(redis_url, None)
        return
    with tempfile.TemporaryDirectory(prefix="printery-bench-") as tmp:
        server = await asyncio.to_thread(start_ephemeral, Path(tmp) / "server", appendonly=False)
        try:
            yield BenchServer(server.url, server.pid)
        finally:
            await asyncio.to_thread(server.stop)
