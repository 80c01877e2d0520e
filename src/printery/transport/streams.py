"""Consumer-group operations printery relies on besides the commit, each a contract.

All functions take the pooled client, so they are coroutine-safe. They know streams,
groups and entries; nothing about what the entries mean.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from printery.base._util import as_text
from printery.base.errors import TransportError, describe
from printery.transport.channel import Command, DirectChannel
from printery.transport.refusal import refusal_error
from printery.transport.scripts import Scripts, script

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
            refusal = refusal_error(exc)
            if refusal is not None:  # credentials: no wait heals them
                raise refusal from exc
            raise TransportError(f"server unreachable: {describe(exc)}") from exc

    return call


LEASE_LUA = script("lease")
REDELIVER_LUA = script("redeliver")
ROUTE_LUA = script("route")


def one_slot(client: object) -> bool:
    """Whether every command of ``client`` must touch keys of one slot (a cluster client):
    then one ``XREADGROUP`` may name only one partition's streams (docs/reference.md,
    Partitions)."""
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


# -- consumer-group reads (the stream worker's intake) ----------------------------------------

#: Entries of one read: per stream, ``(id, fields)`` (fields None: trimmed since delivery).
Read = list[tuple[str, list[tuple[str, dict[str, str] | None]]]]


class GroupGone(Exception):
    """A read found its consumer group gone (its stream was deleted): create it again."""


async def read_new(channel: DirectChannel, group: str, consumer: str, streams: Sequence[str],
                   *, count: int, block_ms: int, also: Sequence[Command] = ()) -> tuple[Read, list[Any]]:
    """``consumer``'s blocking read of entries of ``streams`` no one of ``group`` was given
    yet (``XREADGROUP ... >``): their first delivery, and the replies of the commands
    ``also`` (on the keys of the streams' slot), which the server runs right after the
    read returns. Raises :class:`GroupGone` when the group is not there (NOGROUP).

    On a channel of the consumer's own rather than the pooled client: at one entry per
    read (below saturation) redis-py's per-command path (a pooled connection, its health
    poll, a task per write under a socket timeout, a reply callback) cost more CPU than
    the rest of the read."""
    command = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "BLOCK", block_ms,
               "STREAMS", *streams, *[">"] * len(streams))
    reply, *after = await channel.commands([command, *also], blocking=block_ms / 1000)
    if isinstance(reply, ResponseError):
        if "NOGROUP" in str(reply):
            raise GroupGone(str(reply)) from reply
        raise reply
    if not reply:
        return [], after
    # RESP2: [[stream, entries]]; RESP3: {stream: entries}. An entry trimmed since its
    # delivery comes as [id, nil].
    return [(as_text(stream), [(as_text(entry_id), _fields(flat)) for entry_id, flat in entries])
            for stream, entries in (reply.items() if isinstance(reply, dict) else reply)], after


def _fields(flat: list[Any] | None) -> dict[str, str] | None:
    """An entry's fields from the flat ``[name, value, …]`` of a read's reply."""
    return None if flat is None else dict(zip(flat[::2], flat[1::2], strict=True))


async def claim_idle(client: aioredis.Redis, stream: str, group: str, consumer: str,
                     min_idle_ms: int, count: int) -> list[tuple[str, dict[str, str]]]:
    """Up to ``count`` entries of ``stream`` idle past ``min_idle_ms``, now ``consumer``'s
    (``XAUTOCLAIM`` from the start); those trimmed meanwhile are left out."""
    reply = await client.xautoclaim(stream, group, consumer, min_idle_ms, "0-0", count=count)
    return [(eid, fields) for eid, fields in reply[1] if fields is not None]


async def pending_holders(client: aioredis.Redis, stream: str, group: str) -> tuple[int, list[str]]:
    """How many entries of ``stream`` ``group`` has pending, and the consumers holding
    them (the ``XPENDING`` summary)."""
    summary = await client.xpending(stream, group)
    return int(summary["pending"]), [holder["name"] for holder in summary.get("consumers") or ()]


async def claim_from(client: aioredis.Redis, stream: str, group: str, consumer: str, held_by: str,
                     count: int) -> list[tuple[str, dict[str, str]]] | None:
    """Up to ``count`` entries of ``stream`` that ``held_by`` holds, now ``consumer``'s
    (idle or not: their holder is known gone); those trimmed meanwhile are left out.
    None when ``held_by`` holds nothing (any more)."""
    rows = await client.xpending_range(stream, group, min="-", max="+", count=count,
                                       consumername=held_by)
    if not rows:
        return None
    reply = await client.xclaim(stream, group, consumer, 0, [row["message_id"] for row in rows])
    return [(eid, fields) for eid, fields in reply if fields is not None]


# -- consumers (the service's sweep of departed ones) ------------------------------------------

DELCONSUMER_LUA = script("delconsumer")


async def consumers_of(client: aioredis.Redis, stream: str, group: str) -> list[tuple[str, int]]:
    """Each consumer of ``group`` on ``stream`` with the entries it holds pending; none
    when the stream or the group does not exist (yet)."""
    try:
        infos = await client.xinfo_consumers(stream, group)
    except ResponseError:
        return []
    return [(as_text(info.get("name") or ""), int(info.get("pending", 0))) for info in infos]


async def remove_consumer(scripts: Scripts, stream: str, group: str, consumer: str,
                          min_idle_ms: int) -> bool:
    """Delete ``consumer`` from ``group`` if it still owns nothing and has been idle
    ``min_idle_ms`` (checked by the server in the same step as the delete:
    ``delconsumer.lua``); whether it was deleted."""
    return int(await scripts.call(DELCONSUMER_LUA, [stream], [group, consumer, min_idle_ms])) == 1


async def pending_range(client: aioredis.Redis, stream: str, group: str, start: str, end: str,
                        count: int) -> list[dict[str, Any]]:
    """Up to ``count`` entries ``group`` holds pending on ``stream`` from ``start`` to
    ``end`` (``XPENDING`` extended form: ``message_id``, ``consumer``,
    ``time_since_delivered``, ``times_delivered`` each). A missing stream or group raises
    ``ResponseError`` (NOGROUP)."""
    rows: list[dict[str, Any]] = await client.xpending_range(stream, group, min=start, max=end,
                                                             count=count)
    return rows
