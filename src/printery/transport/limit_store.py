"""The Python half of ``limit.lua``: one call reports what a gate holds and admits
many handler calls of many limit keys atomically (the key layout and the replies: the script)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

import redis.asyncio as aioredis

from printery.base._util import as_text
from printery.transport.channel import DirectChannel
from printery.transport.scripts import script

LIMIT_LUA = script("limit")

#: An admission's reply when it waits for a concurrency slot (no time known).
WAIT_FOR_SLOT = -1


class Bound(NamedTuple):
    """One limit as a request sends it: its key in Redis and its numbers (0: none)."""

    base: str
    concurrency: int
    requests_per_minute: int
    tokens_per_minute: int


class Ask(NamedTuple):
    """``calls`` handler calls under the same ``bounds``, asked for together."""

    calls: int
    bounds: Sequence[Bound]


class Report(NamedTuple):
    """What a gate tells the server of one limit key: the slots it holds now (the truth,
    whatever earlier replies were lost) and tokens its handlers reported since."""

    base: str
    held: int
    tokens: float


def limit_keys(base: str) -> list[str]:
    return [f"{base}:slots", f"{base}:held", f"{base}:started", f"{base}:tokens"]


class LimitStore:
    """Sends limit operations; every reply's decision was taken by the server alone."""

    def __init__(self, client: aioredis.Redis, *, window_ms: int, lease_ms: int) -> None:
        self.window_ms = window_ms
        self.lease_ms = lease_ms
        # A call carries a few arguments per holder: packed in C on a channel of its own
        # (through redis-py's packer they cost about a microsecond each).
        self._channel = DirectChannel(client)
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self._channel.close()

    async def _run(self, keys: list[str], args: list[Any]) -> Any:
        async with self._lock:  # the channel serves one call at a time
            (reply,) = await self._channel.scripts(LIMIT_LUA, [(keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def holders(self, bases: Sequence[str]) -> dict[str, list[str]]:
        """The gates holding slots of each limit key of ``bases`` (lapsed ones included:
        the next request sweeps those)."""
        async with self._lock:
            replies = await self._channel.commands(
                [("ZRANGE", limit_keys(base)[0], 0, -1) for base in bases])
        found: dict[str, list[str]] = {}
        for base, reply in zip(bases, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            found[base] = [as_text(gate) for gate in reply]
        return found

    async def apply(
        self, gate: str, reports: Sequence[Report], asks: Sequence[Ask],
        departed: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[int, int]]:
        """Give back the slots of ``departed`` gates (``(base, gate)``: of processes known
        to be dead), report, then admit in order; per ask how many were admitted, and for
        the rest the ms until the window can admit them, :data:`WAIT_FOR_SLOT`, or 0."""
        bases: dict[str, int] = {}

        def index(base: str) -> int:
            return bases.setdefault(base, len(bases) + 1)

        args: list[Any] = [self.window_ms, self.lease_ms, gate, len(departed)]
        for base, gone in departed:
            args += (index(base), gone)
        args.append(len(reports))
        for report in reports:
            args += (index(report.base), report.held,
                     repr(float(report.tokens)) if report.tokens else "0")
        args.append(len(asks))
        for ask in asks:
            args += (ask.calls, len(ask.bounds))
            for bound in ask.bounds:
                args += (index(bound.base), bound.concurrency, bound.requests_per_minute,
                         bound.tokens_per_minute)
        keys = [key for base in bases for key in limit_keys(base)]
        reply = await self._run(keys, args)
        return [(int(reply[j]), int(reply[j + 1])) for j in range(0, len(reply), 2)]
