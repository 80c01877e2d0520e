"""Queue lag in seconds (issue 17): how long the oldest entry a consumer group still owes
has waited, whether it was delivered and not yet acknowledged (pending) or not delivered
at all. A count of entries says how much is queued; this says how late the group is,
which is what an alert wants. The service's gauge ``printery_queue_lag_seconds`` and the
console read it from here.

The age is the server's clock minus the millisecond part of the entry's id (the server
wrote both), so a host whose clock is off does not skew it. Cost per stream: one round
trip for ``XINFO GROUPS``, then one for ``TIME`` (on its own on a cluster) with, per group, an ``XPENDING``
summary when it has pending entries and an ``XRANGE ... COUNT 1`` when it has
undelivered ones; never a scan of the stream.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from printery._util import stream_id_ms
from printery.keys import StreamKeys
from printery.transport.streams import one_slot

__all__ = ["event_type_lags", "lags_of_groups", "queue_lag_seconds", "stream_lags"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _next_id(entry_id: str) -> str:
    """The smallest id after ``entry_id`` (what an exclusive range start means)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


async def stream_lags(
    client: aioredis.Redis, stream: str, groups: Collection[str] | None = None
) -> dict[str, float]:
    """Seconds of lag of each consumer group of ``stream`` (of ``groups`` only, when
    given): the age of its oldest pending or undelivered entry, 0 when it owes nothing.
    A stream that does not exist yet has no groups: ``{}``."""
    try:
        infos = await client.xinfo_groups(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return {}
        raise
    chosen = [info for info in infos if groups is None or _text(info["name"]) in groups]
    return (await lags_of_groups(client, {stream: chosen}))[stream]


async def lags_of_groups(
    client: aioredis.Redis, infos: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, float]]:
    """Per stream, each group's lag in seconds, given the streams' ``XINFO GROUPS``
    replies (``infos``): one round trip for them all (two on a cluster, whose client
    refuses ``TIME`` in a pipeline: it is asked first, on its own)."""
    clustered = one_slot(client)
    clock: Any = await client.time() if clustered else None
    async with client.pipeline(transaction=False) as pipe:
        if not clustered:
            pipe.time()
        asks: list[tuple[str, str, str]] = []  # (stream, group, "pending" | "undelivered")
        for stream, groups in infos.items():
            for info in groups:
                name = _text(info["name"])
                if int(info.get("pending") or 0) > 0:
                    pipe.xpending(stream, name)
                    asks.append((stream, name, "pending"))
                if info.get("lag") != 0:  # None: unknown after a deletion, so look
                    after = _next_id(_text(info["last-delivered-id"]))
                    pipe.xrange(stream, min=after, count=1)
                    asks.append((stream, name, "undelivered"))
        replies = await pipe.execute()
    if not clustered:
        clock, *replies = replies
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    oldest = {stream: {_text(info["name"]): now_ms for info in groups}
              for stream, groups in infos.items()}
    for (stream, name, kind), reply in zip(asks, replies, strict=True):
        first = reply.get("min") if kind == "pending" else (reply[0][0] if reply else None)
        if first:
            oldest[stream][name] = min(oldest[stream][name], stream_id_ms(_text(first)))
    return {stream: {name: max(0.0, (now_ms - ms) / 1000) for name, ms in groups.items()}
            for stream, groups in oldest.items()}


async def event_type_lags(
    client: aioredis.Redis, keys: StreamKeys, event_type: str, groups: Collection[str] | None = None
) -> dict[str, float]:
    """:func:`stream_lags` of ``event_type`` over every partition of ``keys`` (CONTRACT
    §15): each group's worst, the oldest entry it owes in any partition."""
    worst: dict[str, float] = {}
    for part in keys.each():
        for group, seconds in (await stream_lags(client, part.stream(event_type), groups)).items():
            worst[group] = max(worst.get(group, 0.0), seconds)
    return worst


async def queue_lag_seconds(client: aioredis.Redis, stream: str, group: str) -> float:
    """Seconds the oldest entry ``group`` owes in ``stream`` has waited (0: none owed,
    or no such group)."""
    return (await stream_lags(client, stream, [group])).get(group, 0.0)
