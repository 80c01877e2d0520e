"""Connections to the server: one pooled asyncio client per process, settings chosen for
streams (blocking reads need their own connections; timeouts exceed the block time)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis


def connect(url: str, *, max_connections: int = 256, block_ms: int = 1000) -> aioredis.Redis:
    """A pooled client for ``url`` (``redis://``, ``rediss://``, ``unix://``).

    Replies are decoded to ``str`` (hiredis does it in C). The socket timeout is kept
    above the blocking-read time so a quiet stream is not mistaken for a dead server; no
    connection is made until the first command.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "max_connections": max_connections,
        "socket_timeout": block_ms / 1000 + 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
        "retry_on_timeout": False,
        "encoding_errors": "surrogateescape",
    }
    if urlsplit(url).scheme != "unix":
        # TCP only: redis-py's unix-socket connection refuses the keyword (a TypeError
        # at the first command), and a local socket has no idle peer to detect.
        options["socket_keepalive"] = True
    client: aioredis.Redis = aioredis.Redis.from_url(url, **options)
    return client
