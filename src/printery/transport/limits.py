"""The Python half of ``limit.lua``: one call renews, releases and admits many holders
of many limit keys atomically (see the script for the key layout and the replies)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

import redis.asyncio as aioredis

from printery.transport.channel import DirectChannel

LIMIT_LUA = resources.files("printery.transport").joinpath("limit.lua").read_text()

#: An admission's reply when it waits for a concurrency slot (no time known).
WAIT_FOR_SLOT = -1


class Bound(NamedTuple):
    """One limit as a request sends it: its key in Redis and its numbers (0: none)."""

    base: str
    concurrency: int
    requests_per_minute: int
    tokens_per_minute: int


class Admission(NamedTuple):
    holder: str
    bounds: Sequence[Bound]
    #: Asked before (the reply may have been lost): the server checks whether it admitted it.
    asked: bool = False


class Release(NamedTuple):
    base: str
    holder: str
    slot: bool
    tokens: float


class Renewal(NamedTuple):
    base: str
    holder: str


def limit_keys(base: str) -> list[str]:
    return [f"{base}:slots", f"{base}:starts", f"{base}:tokens", f"{base}:total"]


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

    async def apply(
        self, renewals: Sequence[Renewal], releases: Sequence[Release],
        admissions: Sequence[Admission],
    ) -> list[int]:
        """Renew, then release, then admit in order; per admission 0 (admitted), the ms
        until the window can admit it, or :data:`WAIT_FOR_SLOT`."""
        bases: dict[str, int] = {}

        def index(base: str) -> int:
            return bases.setdefault(base, len(bases) + 1)

        args: list[Any] = [self.window_ms, self.lease_ms, len(renewals)]
        for renewal in renewals:
            args += (index(renewal.base), renewal.holder)
        args.append(len(releases))
        for release in releases:
            args += (index(release.base), release.holder, "1" if release.slot else "0",
                     repr(float(release.tokens)) if release.tokens else "0")
        args.append(len(admissions))
        for admission in admissions:
            args += (admission.holder, "1" if admission.asked else "0", len(admission.bounds))
            for bound in admission.bounds:
                args += (index(bound.base), bound.concurrency, bound.requests_per_minute,
                         bound.tokens_per_minute)
        keys = [key for base in bases for key in limit_keys(base)]
        reply = await self._run(keys, args)
        return [int(value) for value in reply]
