"""The layout record's reads and writes (``<prefix>:layout``; what it means and who
writes it: :mod:`printery.store.partitions`), the two facts of the server a first record is chosen
by (how many masters a cluster has, which streams exist already), and the description of
the pipeline a service runs (``<prefix>:pipeline``)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster

from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.transport.streams import one_slot
from printery.wire.keys import StreamKeys

__all__ = ["describe_pipeline", "existing_streams", "master_count", "read_layout", "record_layout"]

LAYOUT = script("layout")


async def read_layout(client: Redis, prefix: str) -> str | None:
    """The partition count recorded for ``prefix`` as stored, None when there is none."""
    raw = await cast(Awaitable[Any], client.hget(StreamKeys(prefix).layout, "partitions"))
    return None if raw is None else str(raw)


async def record_layout(client: Redis, prefix: str, count: int, *, written_at: str, writer: str,
                        source: str) -> str:
    """Record ``count`` unless a count is recorded already (whoever asked first wins);
    the count recorded, as stored."""
    raw = await Scripts(client).call(LAYOUT, [StreamKeys(prefix).layout],
                                     [count, written_at, writer, source])
    return str(raw)


async def master_count(client: Redis) -> int | None:
    """The masters of a cluster's slot map now; None for one server."""
    if not one_slot(client):
        return None
    cluster = cast(RedisCluster, client)
    await cluster.initialize()
    return len(cluster.get_primaries())


async def existing_streams(client: Redis, streams: Sequence[str]) -> list[str]:
    """Those of ``streams`` that exist, in order (one round trip)."""
    if not streams:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.exists(stream)
        found = await pipe.execute()
    return [stream for stream, n in zip(streams, found, strict=True) if n]


async def describe_pipeline(client: Redis, keys: StreamKeys, description: str) -> None:
    """Keep the pipeline's description (JSON) where operators' tools read it."""
    await client.set(keys.pipeline, description)
