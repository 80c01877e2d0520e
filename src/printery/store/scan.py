"""Reading streams back: one scan of a stream, one of every partition, one entry by id,
and what was added after a position (the live read of followers).

Streams are append-only history; a scan reads one with ``XRANGE`` a chunk at a time
(bounded memory per round trip, O(stream length) in all): fine for what operators and
the read side ask (a run's history, the review and dead-letter inboxes, replay), never
for the hot path. The next chunk starts just after the last id (``(`` syntax), so
nothing is read twice and entries added meanwhile are read too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisError

from printery.keys import StreamKeys
from printery.transport.connection import Redis
from printery.transport.streams import CONNECTION_ERRORS

__all__ = ["CHUNK", "last_ids", "read_after", "read_entry", "scan_partitions", "scan_stream"]

#: Entries per round trip of a scan.
CHUNK = 1000

Entry = tuple[str, dict[str, str]]


async def scan_stream(
    client: Redis, stream: str, start: str = "-", end: str = "+", *, chunk: int = CHUNK,
) -> AsyncIterator[Entry]:
    """Every entry of ``stream`` from ``start`` to ``end`` (inclusive), in id order."""
    lower = start
    while True:
        batch = await client.xrange(stream, lower, end, count=chunk)
        for entry_id, fields in batch:
            yield entry_id, fields
        if len(batch) < chunk:
            return
        lower = "(" + batch[-1][0]


async def scan_partitions(
    client: Redis, keys: StreamKeys, stream_of: Callable[[StreamKeys], str], *,
    count: int | None = None,
) -> AsyncIterator[tuple[StreamKeys, str, dict[str, str]]]:
    """The entries of one stream of every partition of ``keys`` (``stream_of`` names it
    in a partition, e.g. ``lambda part: part.dlq``), partition after partition, each in
    id order; at most ``count`` of each partition when given."""
    for part in keys.each():
        if count is not None:
            for entry_id, fields in await client.xrange(stream_of(part), count=count):
                yield part, entry_id, fields
            continue
        async for entry_id, fields in scan_stream(client, stream_of(part)):
            yield part, entry_id, fields


async def read_entry(client: Any, stream: str, entry_id: str) -> dict[str, str] | None:
    """The fields of one entry, or None when it does not exist (or the id is malformed);
    ``client`` may be a pipeline under WATCH. Connection errors raise."""
    try:
        found = await client.xrange(stream, entry_id, entry_id, count=1)
    except RedisError as exc:
        if isinstance(exc, CONNECTION_ERRORS):
            raise
        return None
    return dict(found[0][1]) if found else None


async def read_after(client: Redis, positions: Mapping[str, str], *, count: int,
                     block_ms: int) -> list[tuple[str, list[Entry]]]:
    """What was added to each stream after its position (``XREAD``), at most ``count``
    per stream, waiting up to ``block_ms`` for something to arrive; per stream its new
    entries (none when nothing came)."""
    streams: dict[Any, Any] = dict(positions)
    reply = await client.xread(streams, count=count, block=block_ms)
    return reply or []


async def last_ids(client: Redis, streams: Sequence[str]) -> dict[str, str]:
    """Each stream's last id now ("0-0" for an empty or missing stream), one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xrevrange(stream, "+", "-", count=1)
        replies = await pipe.execute()
    return {stream: rows[0][0] if rows else "0-0"
            for stream, rows in zip(streams, replies, strict=True)}
