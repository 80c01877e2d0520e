"""Stream retention: acked history is trimmed; pending and undelivered entries never are."""

from __future__ import annotations

import redis.asyncio as aioredis

from printery.service.retention import trim_pipeline_streams, trim_stream
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys


async def _fill(client: aioredis.Redis, stream: str, n: int) -> list[str]:
    # Explicit ids far in the past, so any retention age lets them go.
    return [str(await client.xadd(stream, {"data": str(i)}, id=f"{i}-0")) for i in range(1, n + 1)]


async def _read(client: aioredis.Redis, stream: str, group: str, count: int) -> list[str]:
    reply = await client.xreadgroup(group, "c1", {stream: ">"}, count=count)
    return [eid for _s, entries in reply for eid, _f in entries]


async def _ids(client: aioredis.Redis, stream: str) -> list[str]:
    return [eid for eid, _ in await client.xrange(stream)]


async def test_pending_and_undelivered_survive_acked_are_trimmed(
    client: aioredis.Redis, prefix: str
) -> None:
    stream = f"{prefix}:in"
    ids = await _fill(client, stream, 10)
    await ensure_group(client, stream, "fast")
    await ensure_group(client, stream, "slow")
    # fast: reads 6, acks the first 4 -> 5 and 6 pending, 7..10 undelivered.
    read = await _read(client, stream, "fast", 6)
    await client.xack(stream, "fast", *read[:4])
    # slow: reads 2 and acks them -> 3..10 undelivered for it.
    await client.xack(stream, "slow", *await _read(client, stream, "slow", 2))

    result = await trim_stream(client, stream, retention=0)
    # slow's last-delivered id (2-0) is the bound: 1-0 and 2-0 can go, 3-0 was never read.
    assert result.trimmed == 2 and result.minid == "2-1"
    assert await _ids(client, stream) == ids[2:]

    # slow catches up completely; now fast's oldest pending entry (5-0) is the bound.
    await client.xack(stream, "slow", *await _read(client, stream, "slow", 100))
    result = await trim_stream(client, stream, retention=0)
    assert result.minid == "5-0" and result.trimmed == 2
    remaining = await _ids(client, stream)
    assert remaining == ids[4:], "pending (5, 6) and undelivered-to-fast (7..10) survive"

    # fast acks its pending entries: now its last-delivered id (6-0) bounds the trim.
    await client.xack(stream, "fast", *read[4:])
    result = await trim_stream(client, stream, retention=0)
    assert result.minid == "6-1" and result.trimmed == 2
    assert await _ids(client, stream) == ids[6:]


async def test_retention_age_keeps_recent_history(client: aioredis.Redis, prefix: str) -> None:
    stream = f"{prefix}:in"
    for i in range(5):
        await client.xadd(stream, {"data": str(i)})  # ids from the server clock: now
    await ensure_group(client, stream, "g")
    await client.xack(stream, "g", *await _read(client, stream, "g", 100))
    result = await trim_stream(client, stream, retention=3600)
    assert result.trimmed == 0 and await client.xlen(stream) == 5
    # An explicit cutoff in the past trims nothing either; one in the future leaves the
    # groups as the only bound: everything read and acknowledged goes.
    assert (await trim_stream(client, stream, keep_after_ms=1)).trimmed == 0
    assert (await trim_stream(client, stream, keep_after_ms=2**52)).trimmed == 5


async def test_new_group_from_zero_and_stream_without_groups_are_untouched(
    client: aioredis.Redis, prefix: str
) -> None:
    orphan = f"{prefix}:orphan"
    await _fill(client, orphan, 5)
    assert (await trim_stream(client, orphan, retention=0)).trimmed == 0
    assert (await trim_stream(client, orphan, retention=0, trim_without_groups=True)).trimmed == 5
    fresh = f"{prefix}:fresh"
    await _fill(client, fresh, 5)
    await ensure_group(client, fresh, "g")  # created from 0: has read nothing yet
    assert (await trim_stream(client, fresh, retention=0)).trimmed == 0
    assert await client.xlen(fresh) == 5
    missing = await trim_stream(client, f"{prefix}:missing", retention=0)
    assert missing.trimmed == 0 and missing.minid == ""


async def test_pipeline_trim_never_touches_dlq_or_review(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    types = ["in", "dlq", "review", "review:decided"]
    for event_type in types:
        stream = keys.stream(event_type)
        await _fill(client, stream, 4)
        await ensure_group(client, stream, "g")
        await client.xack(stream, "g", *await _read(client, stream, "g", 100))
    trimmed = await trim_pipeline_streams(client, keys, types, retention_s=0, approximate=False)
    assert trimmed == {"in": 4}
    assert await client.xlen(keys.stream("in")) == 0
    for event_type in ("dlq", "review", "review:decided"):
        assert await client.xlen(keys.stream(event_type)) == 4, event_type
