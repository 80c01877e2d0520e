"""Following one published entry to where its run ends, for whoever published it.

A publisher that waits (``printery emit --wait``, a client) must not sit out its timeout
when the run cannot end the ordinary way: the entry it wrote may go straight to ``dlq``
(too large, undecodable, ``blob_missing``), or wait for a human on ``review``. Both
entries name their source (``source_stream``, ``source_id``), so the entry just written
is recognised exactly; the outcome entry is recognised by the run's id.

Positions are taken *before* publishing (:func:`positions`), so nothing written between
publishing and the first read can be missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import redis.asyncio as aioredis

from printery.envelope import correlation_of
from printery.fields import SOURCE_ID, SOURCE_STREAM
from printery.keys import DLQ, REVIEW, StreamKeys

__all__ = ["Ending", "Published", "follow", "positions"]

_READ_COUNT = 100


@dataclass(frozen=True, slots=True)
class Published:
    """One entry written to start a run: its stream's full key, its id and the run id."""

    stream: str
    entry_id: str
    correlation_id: str


@dataclass(frozen=True, slots=True)
class Ending:
    """Where the run ended: its ``outcome`` entry, or ``dead_lettered`` (the published
    entry itself went to ``dlq``). ``type`` is the event type of the entry's stream."""

    kind: Literal["outcome", "dead_lettered"]
    type: str
    id: str
    fields: dict[str, str] = field(default_factory=dict)


async def positions(client: aioredis.Redis, streams: Iterable[str]) -> dict[str, str]:
    """The last entry id of each stream (``0-0`` when empty): where following starts."""
    found: dict[str, str] = {}
    for stream in streams:
        last = await client.xrevrange(stream, count=1)
        found[stream] = _text(last[0][0]) if last else "0-0"
    return found


async def follow(
    client: aioredis.Redis,
    keys: StreamKeys,
    published: Published,
    *,
    correlation_field: str,
    outcome_types: Iterable[str],
    start: dict[str, str],
    timeout: float,
    on_review: Callable[[str, dict[str, str]], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> Ending | None:
    """Read on from ``start`` (stream key -> id; a stream missing there is read from its
    beginning) until the run's outcome or the published entry's dead letter; None at
    ``timeout`` seconds. A review entry escalated from the published entry is passed to
    ``on_review`` (its id and fields) once, and following goes on: a human may let the
    run continue. ``on_tick`` is called about once a second (a progress display)."""
    deadline = time.monotonic() + timeout
    outcome_keys = {keys.stream(t): t for t in outcome_types}
    dlq_key, review_key = keys.stream(DLQ), keys.stream(REVIEW)
    last = {s: start.get(s, "0-0") for s in [*outcome_keys, dlq_key, review_key]}
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        if on_tick is not None:
            on_tick()
        block = max(1, int(min(remaining, 1.0) * 1000))
        reply = await client.xread(last, count=_READ_COUNT, block=block)  # type: ignore[arg-type]
        for raw_stream, entries in reply or []:
            stream = _text(raw_stream)
            for raw_id, raw_fields in entries:
                entry_id = _text(raw_id)
                last[stream] = entry_id
                fields = {_text(k): _text(v) for k, v in raw_fields.items()}
                if stream in outcome_keys:
                    if correlation_of(fields, correlation_field) == published.correlation_id:
                        return Ending("outcome", outcome_keys[stream], entry_id, fields)
                elif _escalated_from(fields, published):
                    if stream == dlq_key:
                        return Ending("dead_lettered", DLQ, entry_id, fields)
                    if on_review is not None:
                        on_review(entry_id, fields)


def _escalated_from(fields: dict[str, str], published: Published) -> bool:
    return (fields.get(SOURCE_ID) == published.entry_id
            and fields.get(SOURCE_STREAM) == published.stream)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
