"""The commit transaction (transport/streams.py ``commit_commands`` + commit.lua) against a
real server: outputs are appended by plain XADDs in a MULTI, and the script keeps or
withdraws each entry's outputs. What a reader can see afterwards is exactly the outputs
of the entries that committed, in order, whatever else the run held."""

from __future__ import annotations

import redis.asyncio as aioredis

from printery.keys import StreamKeys
from printery.transport.streams import (
    DUPLICATE,
    FENCED,
    DirectChannel,
    PendingOutput,
    commit_args,
    commit_commands,
    commit_results,
    commit_run,
    ensure_group,
)

TTL_MS = 60_000


async def _fill(client: aioredis.Redis, stream: str, count: int) -> None:
    """Group ``g`` on ``stream``, and ``count`` entries in it."""
    await ensure_group(client, stream, "g")
    for n in range(count):
        await client.xadd(stream, {"data": f'{{"n": {n}}}'})


async def _read(client: aioredis.Redis, stream: str, consumer: str, count: int) -> list[str]:
    """Ids of the next ``count`` entries, now pending to ``consumer``."""
    ((_, entries),) = await client.xreadgroup("g", consumer, {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in entries]


async def test_one_run_keeps_only_what_commits_and_a_replay_writes_nothing(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 5)
    ids = await _read(client, stream, "c", 5)
    # Entry 1 now belongs to another consumer; entry 2's record exists already; entry 3
    # has two outputs, the second guarded by a once key that is already taken.
    await client.xclaim(stream, "g", "other", 0, [ids[1]])
    await client.hset(index, mapping={"gen": 1, "start": 2**52})
    await client.sadd(f"{index}:r1", "k2")
    await client.set(keys.once("taken"), "1")

    def call(n: int, *extra: PendingOutput) -> object:
        return commit_args(
            stream=stream, consumer="c", entry_id=ids[n], idempotency_key=f"k{n}",
            outputs=[PendingOutput(out, {"data": f'{{"n": {n}}}'}), *extra],
        )

    run = commit_run(index, "g", TTL_MS, [
        call(0), call(1), call(2),
        call(3, PendingOutput(out, {"data": '{"n": "3b"}'}, keys.once("taken"))),
        call(4),
    ])
    channel = DirectChannel(client)
    try:
        (reply,) = await channel.transact_many([commit_commands(run)])
        assert commit_results(run, reply) == [2, FENCED, DUPLICATE, 2, 2]
        written = [fields["data"] for _, fields in await client.xrange(out)]
        assert written == ['{"n": 0}', '{"n": 3}', '{"n": 4}']
        pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        assert [row["message_id"] for row in pending] == [ids[1]], "all but the fenced acked"
        assert await client.smismember(f"{index}:r1", ["k0", "k1", "k3", "k4"]) == [1, 0, 1, 1]

        # The reply was lost and the run is sent again: everything is now fenced (acked)
        # or a duplicate, so its outputs are withdrawn inside the same transaction.
        (again,) = await channel.transact_many([commit_commands(run)])
        assert commit_results(run, again) == [FENCED, FENCED, FENCED, FENCED, FENCED]
        assert [f["data"] for _, f in await client.xrange(out)] == written
    finally:
        await channel.close()


async def test_an_output_key_of_another_type_fails_its_entry_alone(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, index = keys.stream("in"), keys.idempotency_index("g")
    await _fill(client, stream, 2)
    ids = await _read(client, stream, "c", 2)
    await client.set(keys.stream("blocked"), "x")
    run = commit_run(index, "g", TTL_MS, [
        commit_args(stream=stream, consumer="c", entry_id=ids[0], idempotency_key="a",
                    outputs=[PendingOutput(keys.stream("ok"), {"data": "1"}),
                             PendingOutput(keys.stream("blocked"), {"data": "2"})]),
        commit_args(stream=stream, consumer="c", entry_id=ids[1], idempotency_key="b",
                    outputs=[PendingOutput(keys.stream("ok"), {"data": "3"})]),
    ])
    channel = DirectChannel(client)
    try:
        (reply,) = await channel.transact_many([commit_commands(run)])
        failed, committed = commit_results(run, reply)
    finally:
        await channel.close()
    assert isinstance(failed, Exception) and "WRONGTYPE" in str(failed)
    assert committed == 2
    assert [f["data"] for _, f in await client.xrange(keys.stream("ok"))] == ["3"], (
        "the failed entry's other output is withdrawn")
    pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
    assert [row["message_id"] for row in pending] == [ids[0]]
    assert not await client.sismember(f"{index}:r1", "a"), "no record for the failed entry"


async def test_a_run_of_several_segments_commits_each_entry_on_its_own(
    client: aioredis.Redis, prefix: str
) -> None:
    """Entries of two consumers and two source streams, with one, two and no outputs, a
    key twice in the run and a once key: each entry gets its own verdict, and the outputs
    withdrawn are exactly those of the entries that must not commit."""
    keys = StreamKeys(prefix)
    a, b, out, side = (keys.stream(name) for name in ("a", "b", "out", "side"))
    index = keys.idempotency_index("g")
    for stream in (a, b):
        await _fill(client, stream, 4)
    from_a = await _read(client, a, "c1", 2) + await _read(client, a, "c2", 2)
    from_b = await _read(client, b, "c1", 4)
    await client.set(keys.once("taken"), "1")

    def call(stream: str, consumer: str, entry_id: str, key: str, *outputs: PendingOutput) -> object:
        return commit_args(stream=stream, consumer=consumer, entry_id=entry_id,
                           idempotency_key=key, outputs=list(outputs))

    def to(stream: str, data: str, once: str = "") -> PendingOutput:
        return PendingOutput(stream, {"data": data}, once)

    calls = [
        call(a, "c1", from_a[0], "x", to(out, "a0")),
        call(a, "c1", from_a[1], "y", to(out, "a1")),
        call(a, "c2", from_a[2], "x", to(out, "a2")),  # key x again: a duplicate
        call(a, "c2", from_a[3], "z", to(out, "a3"), to(side, "a3s")),
        call(b, "c1", from_b[0], "w", to(side, "b0", keys.once("fresh"))),
        call(b, "c1", from_b[1], "v", to(side, "b1", keys.once("taken"))),
        call(b, "c1", from_b[2], "u"),  # no outputs
        call(b, "c2", from_b[3], "t", to(out, "b3")),  # b3 is c1's: fenced
        commit_args(stream="", consumer="", entry_id="", idempotency_key=None,
                    outputs=[to(out, "emitted")]),
    ]
    run = commit_run(index, "g", TTL_MS, calls)
    assert run.keys == [index, a, b]
    channel = DirectChannel(client)
    try:
        (reply,) = await channel.transact_many([commit_commands(run)])
    finally:
        await channel.close()
    assert commit_results(run, reply) == [2, 2, DUPLICATE, 3, 2, 1, 1, FENCED, 2]
    assert [f["data"] for _, f in await client.xrange(out)] == ["a0", "a1", "a3", "emitted"]
    assert [f["data"] for _, f in await client.xrange(side)] == ["a3s", "b0"]
    for stream, still in ((a, []), (b, [from_b[3]])):
        pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        assert [row["message_id"] for row in pending] == still
    assert sorted(await client.smembers(f"{index}:r1")) == ["u", "v", "w", "x", "y", "z"]
    assert await client.get(keys.once("fresh")) == "1"


async def test_a_clean_run_replies_with_its_count_and_unsorted_ids_are_checked_one_by_one(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 6)
    ids = await _read(client, stream, "c", 6)
    order = [3, 0, 5, 1, 4, 2]  # handlers finished out of order
    run = commit_run(index, "g", TTL_MS, [
        commit_args(stream=stream, consumer="c", entry_id=ids[n], idempotency_key=f"k{n}",
                    outputs=[PendingOutput(out, {"data": str(n)})])
        for n in order
    ])
    channel = DirectChannel(client)
    try:
        (reply,) = await channel.transact_many([commit_commands(run)])
    finally:
        await channel.close()
    assert reply == 6, "every entry committed: the count alone comes back"
    assert commit_results(run, reply) == [2] * 6
    assert [f["data"] for _, f in await client.xrange(out)] == [str(n) for n in order]
    assert (await client.xpending(stream, "g"))["pending"] == 0
