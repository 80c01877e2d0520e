"""Idempotency records: which entries' idempotency keys a consumer group has committed.

A record is written by the commit (commit.lua, atomically with the outputs and the ack)
as a member of one set per generation (:func:`printery.wire.keys.record_set`: a ring of three
sets); the index hash names the current generation. A generation is current for the
record ttl, then previous (still checked), then expires, so a record is kept at least ttl
and at most about twice that.
:class:`RecordLookup` reads them before handlers run, so a duplicate is acked without
being handled again (the commit checks again, atomically).

Its namesake in other layers (the same job there): :mod:`printery.store.records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from printery.transport.channel import Command, DirectChannel
from printery.wire.keys import record_set


class RecordLookup:
    """Looks up idempotency records in one round trip per batch of keys.

    Plain ``SMISMEMBER`` in a transaction rather than a script: a script's arguments and
    replies are converted to Lua and back, which cost the server twice as much per key.
    The current generation is remembered; the transaction reads it too, and a lookup made
    against a generation that rotated since is repeated. Coroutine-safe: a lookup made
    while others are on the wire takes a connection of its own (kept for the next), so
    batches read one after another do not queue behind each other's round trips (that
    wait was most of a step's latency at a steady 1,000 events/s).
    """

    def __init__(self, channel: DirectChannel, index_key: str) -> None:
        self.index_key = index_key
        self._generation: int | None = None
        #: Channels not in use now; another is made when none is.
        self._idle = [channel]
        self._channels = [channel]

    async def recorded(self, idempotency_keys: Sequence[str]) -> list[bool]:
        """For each key, whether it has a record (in the current or previous generation)."""
        found, _ = await self.recorded_and_read(idempotency_keys)
        return found

    async def recorded_and_read(
        self, idempotency_keys: Sequence[str], reads: Sequence[Command] = ()
    ) -> tuple[list[bool], list[Any]]:
        """:meth:`recorded`, and the replies of ``reads`` (read-only commands, such as the
        budgets of the runs of a batch) from the same round trip (with no key to look up,
        the reads alone, outside a transaction)."""
        if not idempotency_keys and not reads:
            return [], []
        channel = self._idle.pop() if self._idle else self._another()
        try:
            if not idempotency_keys:
                return [], await channel.commands(reads)
            for _ in range(3):
                guess = self._generation
                commands: list[Command] = [("MULTI",), ("HMGET", self.index_key, "gen")]
                for generation in (guess, (guess or 0) - 1):
                    if generation is not None and generation >= 1:
                        commands.append(
                            ("SMISMEMBER", record_set(self.index_key, generation), *idempotency_keys))
                looked_up = len(commands) - 2
                commands += [*reads, ("EXEC",)]
                (executed,) = await channel.transactions([commands])
                if isinstance(executed, Exception):
                    raise executed
                (current,), *found = executed[: 1 + looked_up]
                read = list(executed[1 + looked_up :])
                current = None if current is None else int(current)
                if current == guess:  # a key is recorded if either generation has it
                    if not found:
                        return [False] * len(idempotency_keys), read
                    return [any(row) for row in zip(*found, strict=True)], read
                self._generation = current
                if current is None:
                    return [False] * len(idempotency_keys), read
        finally:
            self._idle.append(channel)
        raise ResponseError(f"idempotency generation of {self.index_key} keeps rotating")

    def _another(self) -> DirectChannel:
        channel = DirectChannel(self._channels[0].client)
        self._channels.append(channel)
        return channel

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


