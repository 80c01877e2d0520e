"""The one StreamOverview (printery.store.overview) and the one count of what waits for
people (printery.store.inbox) against a real server: each figure under its own name, per
event type, partition and group, with ids written in the past so ages are known."""

from __future__ import annotations

import redis.asyncio as aioredis

from printery.store import Waiting, read_overview, waiting
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys


async def server_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_length_pending_undelivered_and_lag_per_partition_and_group(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix, partitions=2)
    one, two = keys.at(0).stream("work"), keys.at(1).stream("work")
    for stream in (one, two):
        await ensure_group(client, stream, "reader")
    await ensure_group(client, one, "other")
    now = await server_ms(client)
    await client.xadd(one, {"data": "{}"}, id=f"{now - 30_000}-0")
    await client.xadd(one, {"data": "{}"}, id=f"{now - 20_000}-0")
    await client.xadd(two, {"data": "{}"}, id=f"{now - 5_000}-0")
    await client.xreadgroup("reader", "c", {one: ">"}, count=1)  # 30 s old, pending

    overview = await read_overview(client, keys, ["work", "never-written"])
    by = {(s.event_type, s.partition): s for s in overview.streams}
    assert list(by) == [("work", 0), ("work", 1), ("never-written", 0), ("never-written", 1)]
    assert (by["work", 0].stream, by["work", 0].length, by["work", 1].length) == (one, 2, 1)
    assert by["never-written", 0].length == 0 and by["never-written", 0].groups == ()

    groups = {g.name: g for g in by["work", 0].groups}
    assert (groups["reader"].pending, groups["reader"].undelivered) == (1, 1)
    assert (groups["other"].pending, groups["other"].undelivered) == (0, 2)
    assert 30.0 <= groups["reader"].lag_s < 40.0 and 30.0 <= groups["other"].lag_s < 40.0
    (second,) = by["work", 1].groups
    assert (second.pending, second.undelivered) == (0, 1) and 5.0 <= second.lag_s < 15.0

    assert overview.length("work") == 3
    lags = overview.lags("work")
    assert set(lags) == {"reader", "other"} and 30.0 <= lags["reader"] < 40.0
    (row, _never) = overview.by_type()
    assert (row["type"], row["length"], row["pending"]) == ("work", 3, 1)
    assert {g["name"]: g["pending"] for g in row["groups"]} == {"reader": 1, "other": 0}
    assert row["lag_s"] == max(g["lag_s"] for g in row["groups"])

    only = await read_overview(client, keys, ["work"], groups={"other"})
    assert {g.name for s in only.streams for g in s.groups} == {"other"}


async def test_reviews_and_dead_letters_are_counted_over_every_partition(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix, partitions=3)
    assert await waiting(client, keys) == Waiting(reviews=0, dead_letters=0)
    for n in range(3):
        await client.xadd(keys.at(n).dlq, {"n": str(n)})
    await client.xadd(keys.at(2).review, {"n": "1"})
    assert await waiting(client, keys) == Waiting(reviews=1, dead_letters=3)
