"""The run index's keyspace, read (what it holds and who writes it:
:mod:`printery.runtime.run_index`; what the reads mean: :mod:`printery.runs.index`).

Per partition: a sorted set of every run by its start (``run_index()``), one per status
(``run_index(status)``), the set of status names seen (``run_statuses``), a hash per run
(``run_info``: ``status``, ``ended``) and a hash per minute of what the steps spent
(``cost_minute``). Every read here is bounded whatever the index holds: a page, a batch of
ids, the counts, sixty minutes.

Its namesake in other layers (the same job there): :mod:`printery.policies.run_index`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.wire.keys import StreamKeys

__all__ = ["FORGET_BATCH", "IndexCounts", "cost_of_minutes", "counts", "forget_ended", "is_indexed",
           "newest", "newest_after", "run_rows", "run_start", "run_starts"]

#: Runs forgotten per script call at most, so a sweep never holds the server long.
FORGET_BATCH = 500

#: Forgets the runs whose outcome is older than the retention (``forget.lua``).
FORGET = script("forget")

#: ``runs`` (all indexed), ``running`` and the status names seen.
IndexCounts = tuple[int, int, set[str]]


async def forget_ended(client: Redis, keys: StreamKeys, retention_s: float, *, running: str,
                       scripts: Scripts | None = None) -> int:
    """Forget the runs of every partition whose outcome is older than ``retention_s``
    (server clock), a bounded batch per script call; how many went. Runs of the status
    ``running`` stay: they have no outcome to age from."""
    runner = scripts or Scripts(client)
    forgotten = 0
    for part in keys.whole.each():
        statuses = sorted(str(s) for s in await client.smembers(part.run_statuses))  # type: ignore[misc]
        ended = [part.run_index(status) for status in statuses if status != running]
        if not ended:
            continue
        while True:
            went, looked_at = await runner.call(
                FORGET, [part.run_index(), *ended],
                [int(retention_s * 1000), FORGET_BATCH, part.run_info("")])
            forgotten += int(went)
            if int(looked_at) < FORGET_BATCH:
                break
    return forgotten


async def newest(client: Redis, keys: StreamKeys, status: str, offset: int,
                 count: int) -> tuple[list[str], int]:
    """The ids of ``count`` runs from ``offset``, newest first (of ``status`` only, "" for
    all), and how many there are: one round trip (each partition gives its newest
    ``offset + count``, merged here)."""
    parts = list(keys.whole.each())
    async with client.pipeline(transaction=False) as pipe:
        for part in parts:
            pipe.zrevrange(part.run_index(status), 0, offset + count - 1, withscores=True)
            pipe.zcard(part.run_index(status))
        replies = await pipe.execute()
    members = sorted((member for n in range(len(parts)) for member in replies[2 * n]),
                     key=lambda member: -float(member[1]))[offset : offset + count]
    total = sum(int(replies[2 * n + 1]) for n in range(len(parts)))
    return [str(m) for m, _ in members], total


async def newest_after(client: Redis, keys: StreamKeys, status: str, count: int, *,
                       after: tuple[int, str] | None = None,
                       since_ms: int | None = None) -> list[tuple[str, int]]:
    """``count`` runs (id, score in ms) newest first, in the order of a reverse range
    (score, then id, both descending) merged over every partition: of ``status`` only
    ("" for all), scored at or after ``since_ms``, and strictly after the position
    ``after`` (a score and a run id, the last of the previous page): one round trip.
    Positions, not offsets, so runs indexed between two pages shift nothing. Each
    partition gives its first ``count`` below the position and every run at exactly its
    score (the runs indexed in that one millisecond), the ones after its id kept."""
    low: int | str = "-inf" if since_ms is None else since_ms
    parts = list(keys.whole.each())
    async with client.pipeline(transaction=False) as pipe:
        for part in parts:
            key = part.run_index(status)
            if after is None:
                pipe.zrevrangebyscore(key, "+inf", low, start=0, num=count, withscores=True)
            else:
                pipe.zrevrangebyscore(key, after[0], after[0], withscores=True)
                pipe.zrevrangebyscore(key, f"({after[0]}", low, start=0, num=count,
                                      withscores=True)
        replies = await pipe.execute()
    found: list[tuple[str, int]] = []
    for reply in replies:
        found += [(str(member), int(score)) for member, score in reply]
    if after is not None:
        found = [(run, score) for run, score in found
                 if score < after[0] or (score == after[0] and run < after[1]
                                         and (since_ms is None or score >= since_ms))]
    found.sort(key=lambda row: (row[1], row[0]), reverse=True)
    return found[:count]


async def run_rows(client: Redis, keys: StreamKeys,
                   run_ids: Sequence[str]) -> list[tuple[int, str | None, int]]:
    """Per run: when it started (ms, 0: not indexed), its status (None: none recorded)
    and when it ended (ms, 0: not yet); one round trip for the lot."""
    if not run_ids:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for run_id in run_ids:
            part = keys.whole.of(run_id)
            pipe.zscore(part.run_index(), run_id)
            pipe.hmget(part.run_info(run_id), ["status", "ended"])
        replies = await pipe.execute()
    rows = []
    for n in range(len(run_ids)):
        started, (status, ended) = replies[2 * n], replies[2 * n + 1]
        rows.append((int(started or 0), str(status) if status else None, int(ended or 0)))
    return rows


async def run_start(client: Redis, keys: StreamKeys, run_id: str) -> str | None:
    """The id of the run's first entry, from its start record (None: no record)."""
    start = await client.get(keys.of(run_id).run_start(run_id))
    return str(start) if start else None


async def run_starts(client: Redis, keys: StreamKeys, run_ids: Sequence[str]) -> list[str | None]:
    """:func:`run_start` of each run, one round trip for the lot."""
    if not run_ids:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for run_id in run_ids:
            pipe.get(keys.of(run_id).run_start(run_id))
        replies = await pipe.execute()
    return [str(start) if start else None for start in replies]


async def is_indexed(client: Redis, keys: StreamKeys, run_id: str) -> bool:
    """Whether the run of exactly this id is in the index."""
    return await client.zscore(keys.whole.of(run_id).run_index(), run_id) is not None


async def counts(client: Redis, keys: StreamKeys, running: str) -> IndexCounts:
    """The runs indexed, those of the status ``running`` and the status names seen, over
    every partition."""
    parts = list(keys.whole.each())
    async with client.pipeline(transaction=False) as pipe:
        for part in parts:
            pipe.zcard(part.run_index())
            pipe.zcard(part.run_index(running))
            pipe.smembers(part.run_statuses)
        replies = await pipe.execute()
    return (sum(int(replies[3 * n]) for n in range(len(parts))),
            sum(int(replies[3 * n + 1]) for n in range(len(parts))),
            {str(s) for n in range(len(parts)) for s in replies[3 * n + 2]})


async def cost_of_minutes(client: Redis, keys: StreamKeys, first: int, last: int) -> dict[str, float]:
    """What the steps reported spending per unit in the minutes ``first`` to ``last``
    (minutes since the epoch, both included), over every partition."""
    async with client.pipeline(transaction=False) as pipe:
        for part in keys.whole.each():
            for minute in range(first, last + 1):
                pipe.hgetall(part.cost_minute(minute))
        buckets: list[dict[str, Any]] = await pipe.execute()
    total: dict[str, float] = {}
    for bucket in buckets:
        for unit, amount in bucket.items():
            total[str(unit)] = total.get(str(unit), 0.0) + float(amount)
    return total
