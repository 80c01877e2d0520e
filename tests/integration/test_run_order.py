"""A run's entries in order across streams: entry ids order the entries of one stream
only, so entries of two streams written in one millisecond (one commit) must not be read
as coming after the run's outcome."""

from __future__ import annotations

import redis.asyncio as aioredis

from printery import Message, Output, Pipeline
from printery.runs.reader import RunReader
from printery.testing import unique_prefix
from printery.wire.keys import StreamKeys


def pipeline() -> Pipeline:
    p = Pipeline("order", ingress=["asked"], correlation_field="run")

    @p.step("answer", consumes=["asked"], produces=["note", "answered"])
    async def answer(message: Message) -> list[Output]:
        return []

    @p.step("log", consumes=["note"])
    async def log(message: Message) -> None:
        return None

    return p


async def test_an_outcome_sorts_after_what_was_written_in_its_millisecond(
    client: aioredis.Redis,
) -> None:
    keys, p = StreamKeys(unique_prefix()), pipeline()
    assert p.outcomes == ("answered", "run:failed", "run:cancelled")
    await client.xadd(keys.stream("asked"), {"data": "{}", "run": "r1"}, id="999-0")
    # One commit in one millisecond: the outcome's stream happens to be at sequence 0,
    # the other stream's at 7.
    await client.xadd(keys.stream("answered"), {"data": "{}", "run": "r1"}, id="1000-0")
    await client.xadd(keys.stream("note"), {"data": "{}", "run": "r1"}, id="1000-7")
    reader = RunReader(client, keys, p)
    followed = [entry["stream"] async for entry in reader.follow("r1")]
    assert followed == ["asked", "note", "answered"]
    result = await reader.result("r1", timeout=5)
    assert [e["stream"] for e in result.entries] == ["asked", "note", "answered"]


async def test_entries_of_one_millisecond_follow_the_graph(client: aioredis.Redis) -> None:
    """Every entry at the same id: what consumes the outcome comes after it, a dead
    letter after the entry it failed on, records of one stream in their id order."""
    p = Pipeline("order", ingress=["asked"], correlation_field="run", outcomes=["answered"])

    @p.step("answer", consumes=["asked"], produces=["note", "answered"])
    async def answer(message: Message) -> None:
        return None

    @p.step("log", consumes=["note"])
    async def log(message: Message) -> None:
        return None

    @p.step("tell", consumes=["answered"], produces=["told"])
    async def tell(message: Message) -> None:
        return None

    keys = StreamKeys(unique_prefix())
    writes = [("told", {"producer": "tell"}), ("dlq", {"worker": "log"}),
              ("dlq", {"worker": "answer"}), ("answered", {}), ("note", {}), ("asked", {})]
    ids = {"dlq": iter(["1000-0", "1000-1"])}
    for stream, fields in writes:
        await client.xadd(keys.stream(stream), {"data": "{}", "run": "r2", **fields},
                          id=next(ids[stream]) if stream in ids else "1000-0")
    reader = RunReader(client, keys, p)
    entries, _ = await reader.history("r2")
    # By depth: asked 0; note and answered 1 (the outcome last); log's dead letter and
    # told 2 (a record first). One stream's entries keep their id order: answer's dead
    # letter (depth 1) waits behind log's, written before it.
    assert [(e["stream"], e.get("worker", "")) for e in entries] == [
        ("asked", ""), ("note", ""), ("answered", ""), ("dlq", "log"), ("dlq", "answer"),
        ("told", "")]
    assert [e["stream"] async for e in reader.follow("r2")] == ["asked", "note", "answered"]
