"""How much waits for people: open reviews and dead letters, over every partition.

One read for both (an ``XLEN`` of each partition's ``review`` and ``dlq`` streams, one
round trip), so the gauges, the console's overview and its pages count them alike. A
review stays in ``review`` until it is decided (the decision deletes it), so the
stream's length is the number open.
"""

from __future__ import annotations

from dataclasses import dataclass

from printery.keys import StreamKeys
from printery.transport.connection import Redis

__all__ = ["Waiting", "waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """Open reviews and dead letters held, over every partition."""

    reviews: int
    dead_letters: int


async def waiting(client: Redis, keys: StreamKeys) -> Waiting:
    """What waits for people under ``keys`` (every partition)."""
    parts = list(keys.each())
    async with client.pipeline(transaction=False) as pipe:
        for part in parts:
            pipe.xlen(part.review)
            pipe.xlen(part.dlq)
        counts = await pipe.execute()
    return Waiting(sum(counts[0::2]), sum(counts[1::2]))
