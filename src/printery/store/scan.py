"""Streams read back (and written to) outside the commit path: one scan of a stream, one
of every partition, entries by id, a page, what was added after a position (the live read
of followers), and entries added together (a replay's copies).

Streams are append-only history; a scan reads one with ``XRANGE`` a chunk at a time
(bounded memory per round trip, O(stream length) in all): fine for what operators and
the read side ask (a run's history, the review and dead-letter inboxes, replay), never
for the hot path. The next chunk starts just after the last id (``(`` syntax), so
nothing is read twice and entries added meanwhile are read too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, cast

from redis.exceptions import RedisError

from printery.transport.connection import Redis
from printery.transport.streams import CONNECTION_ERRORS
from printery.wire.keys import StreamKeys

__all__ = ["CHUNK", "append_entries", "last_ids", "read_after", "read_entries", "read_entry", "read_page",
           "scan_partitions", "scan_stream"]

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


async def read_page(client: Redis, stream: str, start: str, count: int | None) -> list[Entry]:
    """Up to ``count`` entries of ``stream`` from ``start`` (None: every one): one page."""
    page: list[Entry] = await client.xrange(stream, start, "+", count=count)
    return page


async def read_entries(client: Redis, refs: Sequence[tuple[str, str]]) -> list[dict[str, str] | None]:
    """The fields of each ``(stream, id)``, None for one that is gone (trimmed, deleted)
    or that the server refuses; one round trip. Connection errors raise."""
    async with client.pipeline(transaction=False) as pipe:
        for stream, entry_id in refs:
            pipe.xrange(stream, entry_id, entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False)
    found: list[dict[str, str] | None] = []
    for reply in replies:
        if isinstance(reply, CONNECTION_ERRORS):
            raise reply
        found.append(dict(reply[0][1]) if isinstance(reply, list) and reply else None)
    return found


async def append_entries(client: Redis, entries: Sequence[tuple[str, dict[str, str]]]) -> list[str]:
    """Add each ``(stream, fields)`` in one transaction (all or none: their streams share
    a slot); their ids."""
    async with client.pipeline(transaction=True) as pipe:
        for stream, fields in entries:
            pipe.xadd(stream, cast(Any, fields))
        ids = await pipe.execute()
    return [str(entry_id) for entry_id in ids]
