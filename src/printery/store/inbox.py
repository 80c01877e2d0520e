"""What waits for people: open reviews and dead letters, over every partition, counted,
and a review's decision written.

One read for both counts (an ``XLEN`` of each partition's ``review`` and ``dlq`` streams, one
round trip), so the gauges, the console's overview and its pages count them alike. A
review stays in ``review`` until it is decided (the decision deletes it), so the
stream's length is the number open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from printery.keys import StreamKeys
from printery.store.errors import WatchConflict
from printery.store.scan import read_entry
from printery.transport.connection import Redis
from printery.transport.streams import WATCH_RETRIES

__all__ = ["Waiting", "decide_review", "waiting"]


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


async def decide_review(
    client: Redis, keys: StreamKeys, review_id: str, decided: Mapping[str, str],
    outputs: Sequence[tuple[str, Mapping[str, str]]], commands: Sequence[tuple[Any, ...]] = (),
) -> bool:
    """Write a review's decision in one transaction, fenced on the review still being
    open: the ``outputs`` (stream, fields), its ``review:decided`` record (``decided``),
    the review's deletion from ``review`` and the decision's own ``commands``. False when
    the review is not there (decided meanwhile, or never). Raises :class:`WatchConflict`
    after :data:`WATCH_RETRIES` attempts that another writer of the stream overtook."""
    for _ in range(WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(keys.review)
                if await read_entry(pipe, keys.review, review_id) is None:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return False
                pipe.multi()  # type: ignore[no-untyped-call]
                for stream, fields in outputs:
                    pipe.xadd(stream, cast(Any, fields))
                pipe.xadd(keys.review_decided, cast(Any, decided))
                pipe.xdel(keys.review, review_id)
                for command in commands:
                    pipe.execute_command(*command)
                await pipe.execute()
                return True
            except WatchConflict:
                continue
    raise WatchConflict(f"review {review_id}: too much concurrent change")
