"""Queue lag in seconds (printery.store.overview) against a real server: the age of the oldest entry
a group owes, pending (a stalled consumer holds it) or never delivered. Entries are
written with ids in the past (an id's millisecond part is its time), so the ages are
known without waiting."""

from __future__ import annotations

import redis.asyncio as aioredis

from printery.store.overview import event_type_lags, queue_lag_seconds, stream_lags
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys


async def server_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def add_at(client: aioredis.Redis, stream: str, ms: int) -> str:
    return str(await client.xadd(stream, {"data": "{}"}, id=f"{ms}-0"))


async def test_undelivered_pending_and_caught_up(client: aioredis.Redis, prefix: str) -> None:
    stream = f"{prefix}:work"
    for group in ("stalled", "idle", "done"):
        await ensure_group(client, stream, group)
    now = await server_ms(client)
    await add_at(client, stream, now - 30_000)
    await add_at(client, stream, now - 10_000)
    # `stalled` takes the old entry and never acknowledges it; `done` takes and acks both.
    await client.xreadgroup("stalled", "stuck-consumer", {stream: ">"}, count=1)
    taken = await client.xreadgroup("done", "fine-consumer", {stream: ">"})
    await client.xack(stream, "done", *[entry_id for entry_id, _ in taken[0][1]])

    lags = await stream_lags(client, stream)
    # stalled: its pending entry is 30 s old (its undelivered one only 10 s);
    # idle: nothing delivered, the oldest undelivered is 30 s old; done: owes nothing.
    assert 30.0 <= lags["stalled"] < 40.0
    assert 30.0 <= lags["idle"] < 40.0
    assert lags["done"] == 0.0
    assert await queue_lag_seconds(client, stream, "done") == 0.0

    # Once the stalled consumer acknowledges, its lag is the undelivered entry's age.
    pending = await client.xpending(stream, "stalled")
    await client.xack(stream, "stalled", pending["min"])
    assert 10.0 <= await queue_lag_seconds(client, stream, "stalled") < 20.0


async def test_lag_after_a_deleted_entry_and_unknown_names(client: aioredis.Redis, prefix: str) -> None:
    """After a deletion the server may no longer count a group's lag (XINFO says nil,
    here for a group created at an id of its own): the first undelivered entry is still
    found by its id, and an entry before the group's start is not owed."""
    stream = f"{prefix}:work"
    now = await server_ms(client)
    start = await add_at(client, stream, now - 40_000)
    deleted = await add_at(client, stream, now - 20_000)
    await add_at(client, stream, now - 5_000)
    await client.xgroup_create(stream, "reader", id=start)
    await client.xdel(stream, deleted)
    (info,) = await client.xinfo_groups(stream)
    assert info["lag"] is None
    assert 5.0 <= await queue_lag_seconds(client, stream, "reader") < 15.0
    assert await queue_lag_seconds(client, stream, "no-such-group") == 0.0
    assert await stream_lags(client, f"{prefix}:never-written") == {}


async def test_lag_of_an_event_type_is_its_worst_partition(client: aioredis.Redis, prefix: str) -> None:
    """With partitions (docs/reference.md, Partitions) a group reads one stream per
    partition: its lag is the oldest entry it owes in any of them."""
    keys = StreamKeys(prefix, partitions=3)
    for part in keys.each():
        await ensure_group(client, part.stream("work"), "reader")
    now = await server_ms(client)
    await add_at(client, keys.at(1).stream("work"), now - 5_000)
    await add_at(client, keys.at(2).stream("work"), now - 25_000)
    lags = await event_type_lags(client, keys, "work")
    assert list(lags) == ["reader"] and 25.0 <= lags["reader"] < 35.0
    assert await event_type_lags(client, keys, "never-written") == {}
