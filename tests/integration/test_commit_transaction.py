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
    PendingOutput,
    ScriptChannel,
    commit_args,
    commit_commands,
    commit_run,
    ensure_group,
)

TTL_MS = 60_000


async def test_one_run_keeps_only_what_commits_and_a_replay_writes_nothing(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await ensure_group(client, stream, "g")
    for n in range(5):
        await client.xadd(stream, {"data": f'{{"n": {n}}}'})
    ((_, entries),) = await client.xreadgroup("g", "c", {stream: ">"}, count=5)
    ids = [entry_id for entry_id, _ in entries]
    # Entry 1 now belongs to another consumer; entry 2's record exists already; entry 3
    # has two outputs, the second guarded by a once key that is already taken.
    await client.xclaim(stream, "g", "other", 0, [ids[1]])
    await client.hset(index, mapping={"gen": 1, "start": 2**52})
    await client.hset(f"{index}:1", "k2", "1")
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
    channel = ScriptChannel(client)
    try:
        (results,) = await channel.transact_many([commit_commands(run)])
        assert results == [2, FENCED, DUPLICATE, 2, 2]
        written = [fields["data"] for _, fields in await client.xrange(out)]
        assert written == ['{"n": 0}', '{"n": 3}', '{"n": 4}']
        pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        assert [row["message_id"] for row in pending] == [ids[1]], "all but the fenced acked"
        assert await client.hmget(f"{index}:1", ["k0", "k1", "k3", "k4"]) == ["1", None, "1", "1"]

        # The reply was lost and the run is sent again: everything is now fenced (acked)
        # or a duplicate, so its outputs are withdrawn inside the same transaction.
        (again,) = await channel.transact_many([commit_commands(run)])
        assert again == [FENCED, FENCED, FENCED, FENCED, FENCED]
        assert [f["data"] for _, f in await client.xrange(out)] == written
    finally:
        await channel.close()


async def test_an_output_key_of_another_type_fails_its_entry_alone(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, index = keys.stream("in"), keys.idempotency_index("g")
    await ensure_group(client, stream, "g")
    for n in range(2):
        await client.xadd(stream, {"data": f'{{"n": {n}}}'})
    ((_, entries),) = await client.xreadgroup("g", "c", {stream: ">"}, count=2)
    ids = [entry_id for entry_id, _ in entries]
    await client.set(keys.stream("blocked"), "x")
    run = commit_run(index, "g", TTL_MS, [
        commit_args(stream=stream, consumer="c", entry_id=ids[0], idempotency_key="a",
                    outputs=[PendingOutput(keys.stream("ok"), {"data": "1"}),
                             PendingOutput(keys.stream("blocked"), {"data": "2"})]),
        commit_args(stream=stream, consumer="c", entry_id=ids[1], idempotency_key="b",
                    outputs=[PendingOutput(keys.stream("ok"), {"data": "3"})]),
    ])
    channel = ScriptChannel(client)
    try:
        ((failed, committed),) = await channel.transact_many([commit_commands(run)])
    finally:
        await channel.close()
    assert isinstance(failed, Exception) and "WRONGTYPE" in str(failed)
    assert committed == 2
    assert [f["data"] for _, f in await client.xrange(keys.stream("ok"))] == ["3"], (
        "the failed entry's other output is withdrawn")
    pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
    assert [row["message_id"] for row in pending] == [ids[0]]
    assert await client.hget(f"{index}:1", "a") is None, "no record for the failed entry"
