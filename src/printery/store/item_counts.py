"""A Map collector's counts (reference: fan-out): per run, a hash of its items' results
by index (:meth:`~printery.wire.keys.StreamKeys.join` under the collector's name), counted by
``map_count.lua``, which also tells whether the Map's output was written already.

Every result is one count, so counting them one round trip at a time would bound a Map
by the server's latency. The counts asked for while one round trip is out go together
in the next one (one write of ``EVALSHA`` calls on a connection of their own,
:meth:`~printery.transport.channel.DirectChannel.scripts`): a read batch's results, each
handled in a task of its own, are counted in one round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import cast

from printery.transport.channel import DirectChannel
from printery.transport.connection import Redis
from printery.transport.scripts import script
from printery.wire.keys import StreamKeys

__all__ = ["ItemCounts"]

MAP_COUNT = script("map_count")

_Call = tuple[tuple[str, str], tuple[str, str, int], "asyncio.Future[tuple[bool, int]]"]


class ItemCounts:
    """The counts of the collector ``name`` over ``client``; :meth:`close` when its worker
    stops (the connection is not the pool's)."""

    def __init__(self, client: Redis, name: str, *, ttl_s: int) -> None:
        self.client = client
        self.name = name
        self.ttl_s = ttl_s
        self._channel = DirectChannel(client)
        self._asked: list[_Call] = []
        self._sending: asyncio.Task[None] | None = None

    async def count(self, keys: StreamKeys, cid: str, *, once: str, item: int,
                    value: str) -> tuple[bool, int]:
        """Record ``item``'s ``value`` for the run ``cid`` (under ``keys``, its partition's)
        unless recorded before: whether the output was written already (``once`` set) and
        how many items the run has now. Raises what the round trip raised."""
        future: asyncio.Future[tuple[bool, int]] = asyncio.get_running_loop().create_future()
        self._asked.append(((keys.join(self.name, cid), once), (str(item), value, self.ttl_s),
                            future))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self._send())
        return await future

    async def _send(self) -> None:
        """Send what was asked, in rounds, until nothing is left; every asker gets its
        answer or the round trip's error (nothing is kept here to be lost)."""
        while self._asked:
            calls, self._asked = self._asked, []
            try:
                replies = await self._channel.scripts(
                    MAP_COUNT, [(keys, args) for keys, args, _ in calls])
            except BaseException as exc:
                for _, _, future in calls:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception)
                                             else asyncio.CancelledError())
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, _, future), reply in zip(calls, replies, strict=True):
                if future.done():  # its asker was cancelled meanwhile
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    decided, counted = reply
                    future.set_result((bool(decided), int(counted)))

    async def arrived(self, keys: StreamKeys, cid: str) -> Mapping[str, str]:
        """The run's values by item index (read once the count is complete)."""
        return await cast(Awaitable[dict[str, str]],
                          self.client.hgetall(keys.join(self.name, cid)))

    async def close(self) -> None:
        sending = self._sending
        if sending is not None and not sending.done():
            sending.cancel()
        await self._channel.close()


