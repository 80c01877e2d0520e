"""Idempotency records (transport/lua/includes/records.lua): members of one set per generation, against
a real server. A generation's age is set through its index, so no test waits for a TTL."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis

from printery import Message, Pipeline
from printery.runtime.handler import Output
from printery.testing import wait_for
from printery.transport.channel import DirectChannel
from printery.transport.commit import DUPLICATE, Append, Committer, EntryCommit
from printery.transport.records import RecordLookup
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys, record_set
from support.spine import Counting, pipeline_starter, running, stream_worker

TTL_MS = 7 * 86400 * 1000  # ConsumerSettings.record_ttl's default


async def _settled(client: aioredis.Redis, keys: StreamKeys, read: int) -> bool:
    """Every one of the first ``read`` entries of ``in`` was read and acked."""
    (group,) = await client.xinfo_groups(keys.stream("in"))
    return bool(group["pending"] == 0 and group["entries-read"] == read)


async def test_records_are_set_members_kept_across_a_rotation(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    index = keys.idempotency_index("w")
    handler = Counting()
    async with running(stream_worker("w", client, keys, ["in"], handler)):
        await client.xadd(keys.stream("in"), {"data": '{"n": 1}', "idempotency_key": "k1"})
        await wait_for(lambda: _settled(client, keys, 1))
        assert await client.hget(index, "gen") == "1"
        assert await client.type(record_set(index, 1)) == "set"
        assert await client.sismember(record_set(index, 1), "k1")
        assert 0 < await client.pttl(record_set(index, 1)) <= 2 * TTL_MS
        assert sorted([k async for k in client.scan_iter(match=f"{prefix}:idem:*")]) == [
            index, record_set(index, 1)], "one set per generation, no key per record"

        # Generation 1 began a TTL ago: the next commit rotates; its records stay
        # consulted as the previous generation, and expire one TTL from now.
        await client.hset(index, "start", 0)
        await client.xadd(keys.stream("in"), {"data": '{"n": 1}', "idempotency_key": "k1"})
        await wait_for(lambda: _settled(client, keys, 2))
        assert handler.calls == 1, "a duplicate of a previous generation's record"
        assert await client.hget(index, "gen") == "2"
        assert 0 < await client.pttl(record_set(index, 1)) <= TTL_MS

        await client.xadd(keys.stream("in"), {"data": '{"n": 2}', "idempotency_key": "k2"})
        await wait_for(lambda: _settled(client, keys, 3))
        assert handler.calls == 2
        assert await client.sismember(record_set(index, 2), "k2")
        assert not await client.sismember(record_set(index, 1), "k2")
    assert await client.xlen(keys.stream("out")) == 2


async def test_dead_letters_and_emits_write_no_record(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    worker = stream_worker("w", client, keys, ["in"], Counting())
    async with running(worker):
        await client.xadd(keys.stream("in"), {"data": "{not json", "idempotency_key": "bad"})
        await wait_for(lambda: _settled(client, keys, 1))
        assert await worker.emit([Output("out", {"n": 3})], correlation_id="c-3") == 1
    assert await client.xlen(keys.dlq) == 1
    assert await client.xlen(keys.stream("out")) == 1
    assert [k async for k in client.scan_iter(match=f"{prefix}:idem:*")] == []


async def test_commit_script_checks_the_previous_generation_itself(
    client: aioredis.Redis, prefix: str
) -> None:
    """The commit script's own check (not the lookup before the handlers): an entry whose
    key was recorded in the generation before the current one is a duplicate, written
    nowhere and acked; a failed output withdraws the record it just wrote."""
    keys = StreamKeys(prefix)
    index, stream = keys.idempotency_index("g"), keys.stream("in")
    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    await ensure_group(client, stream, "g")
    for n in range(3):
        await client.xadd(stream, {"data": f'{{"n": {n}}}'})
    ((_, entries),) = await client.xreadgroup("g", "c", {stream: ">"}, count=3)
    ids = [entry_id for entry_id, _ in entries]

    async def commit(entry_id: str, key: str, out: str = "out") -> object:
        entry = EntryCommit(stream, "c", entry_id, key, [Append(keys.stream(out), {"data": "{}"})])
        (result,) = await committer.commit([entry])
        return result

    assert await commit(ids[0], "k1") == 2
    await client.hset(index, "start", 0)
    assert await commit(ids[1], "k1") == DUPLICATE
    assert await client.hget(index, "gen") == "2"
    assert await client.xlen(keys.stream("out")) == 1
    assert (await client.xpending(stream, "g"))["pending"] == 1

    await client.set(keys.stream("not-a-stream"), "x")
    result = await commit(ids[2], "k2", out="not-a-stream")
    assert isinstance(result, Exception) and "WRONGTYPE" in str(result)
    assert not await client.sismember(record_set(index, 2), "k2"), "no record is written"
    assert (await client.xpending(stream, "g"))["pending"] == 1, "and the entry not acked"
    await committer.close()


async def test_the_lookup_before_handlers_follows_a_rotation(
    client: aioredis.Redis, prefix: str
) -> None:
    """The lookup remembers the generation; after a rotation it reads the new one (and
    the one before), never a stale guess."""
    index = StreamKeys(prefix).idempotency_index("g")
    lookup = RecordLookup(DirectChannel(client), index)
    try:
        assert await lookup.recorded(["a"]) == [False], "nothing recorded yet"
        await client.hset(index, mapping={"gen": 1, "start": 0})
        await client.sadd(record_set(index, 1), "a")
        assert await lookup.recorded(["a", "b"]) == [True, False]
        await client.hset(index, "gen", 3)  # two rotations: generation 1 is gone from view
        await client.sadd(record_set(index, 2), "b")
        await client.sadd(record_set(index, 3), "c")
        assert await lookup.recorded(["a", "b", "c"]) == [False, True, True]
    finally:
        await lookup.close()


async def test_lookups_made_at_once_do_not_wait_for_each_other(
    client: aioredis.Redis, prefix: str
) -> None:
    """Batches read one after another look up at once: each lookup on the wire has a
    connection of its own (one reply can never be read as another's), every answer is
    its own keys', and the connections are kept for the next lookups."""
    index = StreamKeys(prefix).idempotency_index("g")
    await client.hset(index, mapping={"gen": 1, "start": 0})
    await client.sadd(record_set(index, 1), *[f"k{n}" for n in range(0, 40, 2)])
    lookup = RecordLookup(DirectChannel(client), index)
    try:
        keys = [[f"k{n}", f"k{n + 1}"] for n in range(0, 40, 2)]
        answers = await asyncio.gather(*(lookup.recorded(pair) for pair in keys))
        assert answers == [[True, False]] * 20
        names = [c for c in await client.client_list() if c.get("cmd") in ("exec", "multi")]
        assert len(names) > 1, "the lookups went out together, not one after another"
        again = await asyncio.gather(*(lookup.recorded(pair) for pair in keys))
        assert again == answers
        assert len([c for c in await client.client_list() if c.get("cmd") in ("exec", "multi")]) \
            == len(names), "no connection more for the same number of lookups at once"
    finally:
        await lookup.close()


async def test_only_entries_no_step_wrote_are_looked_up_before_their_handler(
    server: Any, client: aioredis.Redis, prefix: str
) -> None:
    """A step writes one idempotency key once, so the entries it wrote are checked by the
    next step's commit alone: of a three-step chain only the ingress step asks the records
    before handling (seen in the server's own command log). An outside writer's copy of
    a step's entry is still committed nothing (its key has a record), and an ingress
    duplicate still reaches no handler."""
    calls: dict[str, int] = {"a": 0, "b": 0, "c": 0}

    def relay(name: str, out: str | None) -> Any:
        async def handle(message: Message) -> Output | None:
            calls[name] += 1
            return Output(out, message.data) if out else None
        return handle

    pipeline = Pipeline("chain", ingress=["t0"])
    pipeline.step("a", consumes=["t0"], produces=["t1"])(relay("a", "t1"))
    pipeline.step("b", consumes=["t1"], produces=["t2"])(relay("b", "t2"))
    pipeline.step("c", consumes=["t2"], produces=[])(relay("c", None))
    keys = StreamKeys(prefix)
    lookups: list[str] = []

    async def watch() -> None:
        async with aioredis.Redis.from_url(server.url, decode_responses=True).monitor() as log:
            async for command in log.listen():
                text = command.get("command", "")
                if text.startswith("SMISMEMBER") and command.get("client_type") != "lua" \
                        and f"{prefix}:" in text:
                    lookups.append(text.split()[1])

    watcher = asyncio.create_task(watch())
    try:
        async with pipeline_starter(server.url, client, prefix, max_deliveries=2) as start:
            submitter = await start(pipeline)
            for n in range(3):
                await submitter.submit({"n": n}, run_id=f"run-{n}")
                await wait_for(lambda n=n: _reached(calls, "c", n + 1))
            # An outside copy of what a wrote for run-0, and an ingress duplicate of run-1.
            ((_, wrote),) = await client.xrange(keys.stream("t1"), count=1)
            await client.xadd(keys.stream("t1"), wrote)
            ((_, first),) = await client.xrange(keys.stream("t0"), count=1)
            await client.xadd(keys.stream("t0"), first)
            for stream, group in ((keys.stream("t1"), "b"), (keys.stream("t0"), "a")):
                await wait_for(lambda s=stream, g=group: _group_settled(client, s, g, 4))
        assert calls["a"] == 3, "an ingress duplicate reaches no handler"
        assert await client.xlen(keys.stream("t2")) == 3, "an outside copy commits nothing"
        assert lookups, "the ingress step looked its records up"
        assert {key.rsplit(":", 2)[-2] for key in lookups} == {"a"}, lookups
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _reached(calls: dict[str, int], step: str, count: int) -> bool:
    return calls[step] == count


async def _group_settled(client: aioredis.Redis, stream: str, group: str, read: int) -> bool:
    for info in await client.xinfo_groups(stream):
        if info["name"] == group:
            return bool(info["pending"] == 0 and info["entries-read"] == read)
    return False
