"""Consumer-group operations printery relies on besides the commit, each a contract.

All functions take the pooled client, so they are coroutine-safe. They know streams,
groups and entries; nothing about what the entries mean.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from importlib import resources
from typing import Any, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from printery.errors import TransportError, describe

#: What "the server is not reachable right now" looks like: worth waiting and retrying.
#: On a cluster also a failover in progress (CLUSTERDOWN, TRYAGAIN, a slot no master
#: holds yet) that outlasted the cluster client's own retries.
CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, TransportError,
                     ClusterDownError, TryAgainError, SlotNotCoveredError)


#: Attempts of a WATCH/MULTI transaction before giving up on concurrent change.
WATCH_RETRIES = 20

P = ParamSpec("P")
T = TypeVar("T")


def public_api(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """For functions of the public API: a connection failure reaches the caller as
    :class:`TransportError` (the client's own exception as its cause), so callers catch
    one printery error, whatever the client library. A deadline the caller set
    (the builtin :class:`TimeoutError`) stays what it is."""

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except (TransportError, TimeoutError):
            raise
        except CONNECTION_ERRORS as exc:
            raise TransportError(f"server unreachable: {describe(exc)}") from exc

    return call


def _script(name: str) -> str:
    return resources.files("printery.transport").joinpath(name).read_text()


LEASE_LUA = _script("lease.lua")
REDELIVER_LUA = _script("redeliver.lua")
ROUTE_LUA = _script("route.lua")


def one_slot(client: object) -> bool:
    """Whether every command of ``client`` must touch keys of one slot (a cluster client):
    then one ``XREADGROUP`` may name only one partition's streams (CONTRACT §15)."""
    return isinstance(client, RedisCluster)


async def ensure_group(client: aioredis.Redis, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` from id 0 (MKSTREAM). Idempotent: an existing group is
    fine, and starting from 0 means entries published before the first start are seen."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def delivery_counts(
    client: aioredis.Redis, stream: str, group: str, ids: Sequence[str]
) -> dict[str, int]:
    """How many times Redis has delivered each pending id (the authoritative count)."""
    if not ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    counts: dict[str, int] = {}
    for entry_id, rows in zip(ids, await pipe.execute(), strict=True):
        if rows:
            counts[entry_id] = int(rows[0]["times_delivered"])
    return counts


class Scripts:
    """Runs Lua scripts by SHA, loaded lazily and loaded again after a server restart."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._sha: dict[str, str] = {}

    async def call(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        for _ in range(2):
            sha = self._sha.get(source)
            if sha is None:
                sha = self._sha[source] = str(await self.client.script_load(source))
            try:
                return await cast(
                    Awaitable[Any], self.client.evalsha(sha, len(keys), *keys, *args))
            except NoScriptError:
                self._sha.pop(source, None)
        raise ResponseError("script could not be loaded")


class Leases:
    """Lease operations on entries a consumer of ``group`` holds. Each checks ownership
    first, so it never touches an entry another consumer owns now."""

    def __init__(self, client: aioredis.Redis, group: str) -> None:
        self.scripts = Scripts(client)
        self.group = group

    async def renew(self, stream: str, consumer: str, ids: Sequence[str]) -> None:
        """Reset the idle time of entries still ours, so nobody claims a live entry."""
        await self.scripts.call(LEASE_LUA, [stream], [self.group, consumer, "0", *ids])

    async def hand_back(self, stream: str, consumer: str, ids: Sequence[str], idle_ms: int) -> None:
        """Make entries we will not finish claimable by others now (idle ``idle_ms``)."""
        await self.scripts.call(LEASE_LUA, [stream], [self.group, consumer, str(idle_ms), *ids])

    async def redeliver(self, stream: str, consumer: str, entry_id: str) -> int:
        """Take an entry we hold again as a counted delivery; its delivery count, or -1
        when it is no longer ours."""
        return int(await self.scripts.call(REDELIVER_LUA, [stream], [self.group, consumer, entry_id]))
