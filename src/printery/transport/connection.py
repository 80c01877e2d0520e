"""Connections to the server: one pooled asyncio client per process, settings chosen for
streams (blocking reads need their own connections; timeouts exceed the block time)."""

from __future__ import annotations

import redis.asyncio as aioredis


def connect(url: str, *, max_connections: int = 256, block_ms: int = 1000) -> aioredis.Redis:
    """A pooled client for ``url`` (``redis://``, ``rediss://``, ``unix://``).

    Replies are decoded to ``str`` (hiredis does it in C). The socket timeout is kept
    above the blocking-read time so a quiet stream is not mistaken for a dead server; no
    connection is made until the first command.
    """
    client: aioredis.Redis = aioredis.Redis.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        socket_timeout=block_ms / 1000 + 10,
        socket_connect_timeout=5,
        socket_keepalive=True,
        health_check_interval=30,
        retry_on_timeout=False,
        encoding_errors="surrogateescape",
    )
    return client
