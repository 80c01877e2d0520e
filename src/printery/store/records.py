"""Small records a worker keeps beside the streams: the last error of an entry that failed,
so that its dead letter, written after a later delivery (when its process died each time),
still says what went wrong.

Its namesake in other layers (the same job there): :mod:`printery.transport.records`."""

from __future__ import annotations

from printery.transport.connection import Redis

__all__ = ["read_record", "write_record"]


async def read_record(client: Redis, key: str) -> str | None:
    """The record under ``key``, None when there is none (never written, or expired)."""
    raw = await client.get(key)
    return None if raw is None else str(raw)


async def write_record(client: Redis, key: str, record: str, *, ttl_ms: int) -> None:
    """Keep ``record`` under ``key`` for ``ttl_ms``."""
    await client.set(key, record, px=ttl_ms)
