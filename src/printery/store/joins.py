"""An aggregator's keyspace: a hash per open join, a sorted set of their deadlines.

Each join's hash (:meth:`~printery.wire.keys.StreamKeys.join`) holds the arrivals by branch
name as JSON, the opening's time (``__opened_at``), the sweep's failed attempts
(``__sweep_attempts``) and late arrivals (``late:<branch>``); it expires ``ttl_s`` after
its last write. The deadlines set (:meth:`~printery.wire.keys.StreamKeys.join_deadlines`)
scores each open join by when a sweep may decide it; a sweep leases what it takes by
moving the score (``take_due.lua``). Both live in the run's partition; the result's
``once`` key tells whether the join was decided.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, cast

from printery.transport.connection import Redis
from printery.transport.dead_letter import DeadLetterWrite, write_dead_letter
from printery.transport.scripts import Scripts, script
from printery.wire.keys import StreamKeys

__all__ = ["ATTEMPTS", "OPENED_AT", "JoinStore", "arrivals"]

OPENED_AT, ATTEMPTS = "__opened_at", "__sweep_attempts"
TAKE_DUE = script("take_due")


class JoinStore:
    """The joins of the aggregator ``name`` over ``client``."""

    def __init__(self, client: Redis, name: str, *, ttl_s: int) -> None:
        self.client = client
        self.name = name
        self.ttl_s = ttl_s
        self._scripts = Scripts(client)

    async def arrive(
        self, keys: StreamKeys, cid: str, *, once: str, slot: str, data: str,
        opened_ms: int | None = None, deadline_ms: int = 0,
    ) -> tuple[bool, dict[str, str]]:
        """Record ``slot``'s arrival (``data``, JSON) unless it arrived before; an opening
        (``opened_ms`` given) also files the join under its deadline. In one transaction
        with the read: whether the join was decided (``once`` set) and its hash now."""
        join_key = keys.join(self.name, cid)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.exists(once)
            pipe.hsetnx(join_key, slot, data)
            if opened_ms is not None:
                pipe.hsetnx(join_key, OPENED_AT, str(opened_ms))
                pipe.zadd(keys.join_deadlines(self.name), {cid: deadline_ms}, nx=True)
            pipe.expire(join_key, self.ttl_s)
            pipe.hgetall(join_key)
            results = await pipe.execute()
        return bool(results[0]), results[-1]

    async def late(self, keys: StreamKeys, cid: str, slot: str, at: str) -> None:
        """Note that ``slot`` arrived ``at`` after the join was decided."""
        await cast(Awaitable[int], self.client.hset(keys.join(self.name, cid), f"late:{slot}", at))

    async def take_due(self, keys: StreamKeys, now_ms: int, *, lease_ms: int, batch: int) -> list[str]:
        """Up to ``batch`` joins of ``keys``'s partition due by ``now_ms``, leased to the
        caller for ``lease_ms`` (another sweep does not take them meanwhile)."""
        due = await self._scripts.call(TAKE_DUE, [keys.join_deadlines(self.name)],
                                       [now_ms, now_ms + lease_ms, batch])
        return [str(cid) for cid in due]

    async def read(self, keys: StreamKeys, cid: str, once: str) -> tuple[bool, dict[str, str]]:
        """Whether the join was decided (``once`` set), and its hash."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.exists(once)
            pipe.hgetall(keys.join(self.name, cid))
            decided, raw = await pipe.execute()
        return bool(decided), raw

    async def failed_attempt(self, keys: StreamKeys, cid: str) -> int:
        """Count a failed attempt at deciding the join; how many there were."""
        join_key = keys.join(self.name, cid)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hincrby(join_key, ATTEMPTS, 1)
            pipe.expire(join_key, self.ttl_s)
            attempt, _ = await pipe.execute()
        return int(attempt)

    async def due_again(self, keys: StreamKeys, cid: str, at_ms: int) -> None:
        """Take the join up again at ``at_ms`` (its lease given back early)."""
        await self.client.zadd(keys.join_deadlines(self.name), {cid: at_ms}, xx=True)

    async def done(self, keys: StreamKeys, cid: str) -> None:
        """No sweep needs to look at the join again."""
        await self.client.zrem(keys.join_deadlines(self.name), cid)

    async def dead_letter(self, letter: DeadLetterWrite) -> bool:
        """Write the failed join's dead letter (under its ``once`` guard): False when the
        join was decided meanwhile and nothing was written."""
        return await write_dead_letter(self._scripts, letter) is not None


def arrivals(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The branches' fields of a join's hash (not the bookkeeping, not late arrivals)."""
    return {k: v for k, v in raw.items() if not k.startswith(("__", "late:"))}
