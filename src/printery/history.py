"""Reading a run's history back from the streams: every entry of one correlation id.

Streams are append-only history; these helpers scan them with XRANGE in chunks
(O(stream length)): fine for operator use (``trace``, ``replay``, ``cost``), not for a
hot path. An entry belongs to a run by :func:`~printery.envelope.correlation_of`: its
correlation field, else the id inside its ``data`` (what an external producer that wrote
only ``data`` leaves), so such entries are found like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis

from printery.envelope import correlation_of
from printery.keys import DLQ, REVIEW, REVIEW_DECIDED, StreamKeys
from printery.pipeline.dag import Pipeline

__all__ = ["RunEntry", "find_entries", "run_entries", "scan_stream"]

_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class RunEntry:
    """One entry of a run: its event type (the stream), id and fields as written."""

    type: str
    id: str
    fields: dict[str, str]


async def scan_stream(
    client: aioredis.Redis, stream: str, start: str = "-", chunk: int = _CHUNK
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Every entry of ``stream`` from ``start``, in id order, ``chunk`` at a time.

    Bounded memory per round trip; the next chunk starts exclusively after the last id
    (``(`` syntax), so nothing is read twice.
    """
    lower = start
    while True:
        batch = await client.xrange(stream, lower, "+", count=chunk)
        for entry_id, fields in batch:
            yield _text(entry_id), {_text(k): _text(v) for k, v in fields.items()}
        if len(batch) < chunk:
            return
        lower = "(" + _text(batch[-1][0])


async def find_entries(
    client: aioredis.Redis, stream: str, field: str, value: str
) -> list[tuple[str, dict[str, str]]]:
    """Entries of ``stream`` of the run ``value`` (correlation ``field``), oldest first."""
    return [(i, f) async for i, f in scan_stream(client, stream)
            if correlation_of(f, field) == value]


async def run_entries(
    client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline, correlation_id: str
) -> list[RunEntry]:
    """Every entry of one run across the pipeline's streams and ``dlq``, ``review`` and
    ``review:decided``, in time (entry id) order."""
    field = pipeline.correlation_field
    found: list[RunEntry] = []
    for event_type in dict.fromkeys([*pipeline.event_types(), DLQ, REVIEW, REVIEW_DECIDED]):
        found += [RunEntry(event_type, entry_id, fields) for entry_id, fields in
                  await find_entries(client, keys.stream(event_type), field, correlation_id)]
    found.sort(key=lambda e: id_order(e.id))
    return found


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
