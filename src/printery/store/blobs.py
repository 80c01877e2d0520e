"""Payloads kept by reference: one key per blob, named by its content's SHA-256 (what a
reference means and when one is written: :mod:`printery.runtime.payloads`)."""

from __future__ import annotations

from printery.base._util import as_text
from printery.transport.connection import Redis
from printery.wire.keys import StreamKeys

__all__ = ["read_blob", "write_blob"]


async def read_blob(client: Redis, keys: StreamKeys, digest: str) -> str | None:
    """The blob of ``digest``, or None when it expired or was never written."""
    blob = await client.get(keys.blob(digest))
    return None if blob is None else as_text(blob)


async def write_blob(client: Redis, keys: StreamKeys, digest: str, data: str, *, ttl_ms: int) -> None:
    """Keep ``data`` as the blob of ``digest`` for ``ttl_ms`` (content-addressed: writing
    the same blob again only refreshes its expiry)."""
    await client.set(keys.blob(digest), data, px=ttl_ms)
