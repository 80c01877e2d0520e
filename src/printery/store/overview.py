"""What waits in the pipeline's streams: one :class:`StreamOverview`, read the same way
for ``printery streams``, the console and the gauges.

Per event type, partition and consumer group it holds four figures that answer different
questions, each under its own name:

* ``length``: entries the stream holds (``XLEN``), acknowledged or not;
* ``pending``: entries delivered to a consumer of the group and not acknowledged;
* ``undelivered``: entries no consumer of the group was given yet (``XINFO GROUPS``'s
  ``lag``, a count; None when the server cannot count it after a deletion);
* ``lag_s``: seconds the oldest entry the group owes, pending or undelivered, has waited:
  how late the group is, which is what an alert wants (0 when it owes nothing).

The age is the server's clock minus the millisecond part of the entry's id (the server
wrote both), so a host whose clock is off does not skew it. Cost: one round trip for
``XLEN`` and ``XINFO GROUPS`` of every stream, then one for ``TIME`` (on its own on a
cluster) with, per group, an ``XPENDING`` summary when it has pending entries and an
``XRANGE ... COUNT 1`` when it has undelivered ones; never a scan of a stream.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from printery.base._util import stream_id_ms
from printery.transport.connection import Redis
from printery.transport.streams import one_slot
from printery.wire.keys import StreamKeys

__all__ = [
    "GroupFigures", "StreamFigures", "StreamOverview", "event_type_lags", "lags_of_groups",
    "queue_lag_seconds", "read_overview", "stream_lags",
]


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One consumer group of one stream (see the module's docstring for each figure)."""

    name: str
    consumers: int
    pending: int
    undelivered: int | None
    lag_s: float
    last_delivered_id: str


@dataclass(frozen=True, slots=True)
class StreamFigures:
    """One stream: an event type in one partition (``partition`` None: not partitioned)."""

    event_type: str
    stream: str
    partition: int | None
    length: int
    groups: tuple[GroupFigures, ...]


@dataclass(frozen=True, slots=True)
class StreamOverview:
    """Every stream asked for, in the order asked (event type, then partition)."""

    streams: tuple[StreamFigures, ...]

    def length(self, event_type: str) -> int:
        """Entries of ``event_type`` over every partition."""
        return sum(s.length for s in self.streams if s.event_type == event_type)

    def lags(self, event_type: str) -> dict[str, float]:
        """Each group's lag in seconds over every partition of ``event_type``: its worst,
        the oldest entry it owes in any of them."""
        worst: dict[str, float] = {}
        for figures in self.streams:
            if figures.event_type == event_type:
                for group in figures.groups:
                    worst[group.name] = max(worst.get(group.name, 0.0), group.lag_s)
        return worst

    def by_type(self) -> list[dict[str, Any]]:
        """One row per event type, its partitions summed: ``length``, ``pending``, the
        worst ``lag_s``, and per group its ``pending`` (summed) and ``lag_s`` (worst)."""
        rows: dict[str, dict[str, Any]] = {}
        for figures in self.streams:
            row = rows.setdefault(figures.event_type,
                                  {"type": figures.event_type, "length": 0, "groups": {}})
            row["length"] += figures.length
            for g in figures.groups:
                group = row["groups"].setdefault(g.name, {"name": g.name, "pending": 0, "lag_s": 0.0})
                group["pending"] += g.pending
                group["lag_s"] = max(group["lag_s"], g.lag_s)
        result = []
        for row in rows.values():
            groups = list(row["groups"].values())
            result.append({**row, "groups": groups,
                           "lag_s": max((g["lag_s"] for g in groups), default=0.0),
                           "pending": sum(g["pending"] for g in groups)})
        return result


async def read_overview(
    client: Redis, keys: StreamKeys, event_types: Iterable[str],
    groups: Collection[str] | None = None,
) -> StreamOverview:
    """The overview of ``event_types`` (each once, in order) over every partition of
    ``keys`` (only the consumer groups named in ``groups``, when given). A stream that
    does not exist yet is there with length 0 and no groups."""
    streams = [(event_type, part) for event_type in dict.fromkeys(event_types)
               for part in keys.each()]
    async with client.pipeline(transaction=False) as pipe:
        for event_type, part in streams:
            pipe.xlen(part.stream(event_type))
            pipe.xinfo_groups(part.stream(event_type))
        replies = await pipe.execute(raise_on_error=False)
    infos: dict[str, list[dict[str, Any]]] = {}
    for (event_type, part), found in zip(streams, replies[1::2], strict=True):
        chosen = found if isinstance(found, list) else []  # an error: no stream yet
        infos[part.stream(event_type)] = [
            info for info in chosen if groups is None or str(info["name"]) in groups]
    lags = await lags_of_groups(client, infos)
    figures = []
    for (event_type, part), length in zip(streams, replies[0::2], strict=True):
        stream = part.stream(event_type)
        figures.append(StreamFigures(
            event_type, stream, part.partition if part.partitioned else None,
            length if isinstance(length, int) else 0,
            tuple(GroupFigures(
                str(info["name"]), int(info.get("consumers") or 0), int(info.get("pending") or 0),
                None if info.get("lag") is None else int(info["lag"]),
                lags[stream].get(str(info["name"]), 0.0), str(info.get("last-delivered-id", "")),
            ) for info in infos[stream])))
    return StreamOverview(tuple(figures))


def _next_id(entry_id: str) -> str:
    """The smallest id after ``entry_id`` (what an exclusive range start means)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


async def lags_of_groups(
    client: Redis, infos: dict[str, list[dict[str, Any]]]
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
                name = str(info["name"])
                if int(info.get("pending") or 0) > 0:
                    pipe.xpending(stream, name)
                    asks.append((stream, name, "pending"))
                if info.get("lag") != 0:  # None: unknown after a deletion, so look
                    after = _next_id(str(info["last-delivered-id"]))
                    pipe.xrange(stream, min=after, count=1)
                    asks.append((stream, name, "undelivered"))
        replies = await pipe.execute()
    if not clustered:
        clock, *replies = replies
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    oldest = {stream: {str(info["name"]): now_ms for info in groups}
              for stream, groups in infos.items()}
    for (stream, name, kind), reply in zip(asks, replies, strict=True):
        first = reply.get("min") if kind == "pending" else (reply[0][0] if reply else None)
        if first:
            oldest[stream][name] = min(oldest[stream][name], stream_id_ms(str(first)))
    return {stream: {name: max(0.0, (now_ms - ms) / 1000) for name, ms in groups.items()}
            for stream, groups in oldest.items()}


async def stream_lags(
    client: Redis, stream: str, groups: Collection[str] | None = None
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
    chosen = [info for info in infos if groups is None or str(info["name"]) in groups]
    return (await lags_of_groups(client, {stream: chosen}))[stream]


async def event_type_lags(
    client: Redis, keys: StreamKeys, event_type: str, groups: Collection[str] | None = None
) -> dict[str, float]:
    """Each group's lag in seconds over every partition of ``keys``: its worst, the
    oldest entry it owes in any of them."""
    return (await read_overview(client, keys, [event_type], groups)).lags(event_type)


async def queue_lag_seconds(client: Redis, stream: str, group: str) -> float:
    """Seconds the oldest entry ``group`` owes in ``stream`` has waited (0: none owed,
    or no such group)."""
    return (await stream_lags(client, stream, [group])).get(group, 0.0)
