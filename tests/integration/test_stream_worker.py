"""The stream worker's delivery guarantees, against a real server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from printery.base.errors import Reject
from printery.runtime.handler import Message, Output
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import CODEC, Counting, outputs_by_n, publish, relay, running, stream_worker


async def _len(client: aioredis.Redis, key: str, n: int) -> bool:
    return int(await client.xlen(key)) >= n


async def test_group_created_idempotently_from_zero(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    await publish(client, keys, "in", 3)  # published before the group exists
    worker = stream_worker("w", client, keys, ["in"], relay("out"))
    await worker.prepare()
    await worker.prepare()  # an existing group is fine
    async with running(worker):
        await wait_for(lambda: _len(client, keys.stream("out"), 3))


async def test_consumers_have_unique_names(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    worker = stream_worker("w", client, keys, ["in"], relay("out"), concurrency=3)
    async with running(worker):
        await publish(client, keys, "in", 30)
        await wait_for(lambda: _len(client, keys.stream("out"), 30))
        consumers = await client.xinfo_consumers(keys.stream("in"), "w")
        names = [c["name"] for c in consumers]
        assert len(names) == 3 and len(set(names)) == 3
        assert all(name.split(":")[2] == "w" for name in names)


async def test_envelope_defaults_filled_for_external_producer(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    seen: list[Message] = []

    async def handler(msg: Message) -> Output:
        seen.append(msg)
        return Output("out", msg.data)

    async with running(stream_worker("w", client, keys, ["in"], handler)):
        await client.xadd(keys.stream("in"), {"data": '{"correlation_id": "abc", "x": 1}'})
        await wait_for(lambda: _len(client, keys.stream("out"), 1))
        env = seen[0].envelope
        assert env.type == "in" and env.correlation_id == "abc" and env.attempt == 1
        assert env.idempotency_key == "in:abc" and env.producer == "external"
        assert env.event_id and env.produced_at.endswith("Z")
        (_, out), = await client.xrange(keys.stream("out"))
        for field in ("data", "type", "event_id", "correlation_id", "idempotency_key", "attempt",
                      "produced_at", "producer", "duration_ms"):
            assert field in out, field
        assert out["producer"] == "w" and out["correlation_id"] == "abc"


async def test_duplicate_idempotency_key_acked_without_handler(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    handler = Counting()
    async with running(stream_worker("w", client, keys, ["in"], handler)):
        fields = {"data": '{"n": 1}', "idempotency_key": "same"}
        await client.xadd(keys.stream("in"), fields)
        await wait_for(lambda: _len(client, keys.stream("out"), 1))
        await client.xadd(keys.stream("in"), fields)
        await wait_for(lambda: _all_acked(client, keys.stream("in"), "w", 2))
        assert handler.calls == 1
        assert await client.xlen(keys.stream("out")) == 1


async def _all_acked(client: aioredis.Redis, stream: str, group: str, delivered: int) -> bool:
    info = {g["name"]: g for g in await client.xinfo_groups(stream)}
    group_info = info[group]
    return bool(group_info["pending"] == 0 and group_info["entries-read"] == delivered)


async def test_poison_undecodable_goes_to_dlq_at_once(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    async with running(stream_worker("w", client, keys, ["in"], relay("out"))):
        await client.xadd(keys.stream("in"), {"data": "{not json"})
        await client.xadd(keys.stream("in"), {"nodata": "x"})
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _len(client, keys.dlq, 2))
        await wait_for(lambda: _len(client, keys.stream("out"), 1))
        for _id, entry in await client.xrange(keys.dlq):
            assert entry["reason_code"] == "undecodable"
            assert entry["deliveries"] == "1"
            assert entry["worker"] == "w"
            assert entry["source_stream"] == keys.stream("in")
            assert entry["source_id"] and entry["failed_at"] and entry["error"]
        assert (await client.xpending(keys.stream("in"), "w"))["pending"] == 0


async def test_failing_handler_goes_to_dlq_after_max_deliveries(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    attempts: list[int] = []

    async def handler(msg: Message) -> Output:
        if msg.data["n"] == 0:
            attempts.append(msg.deliveries)
            raise ValueError("always fails")
        return Output("out", msg.data)

    async with running(stream_worker("w", client, keys, ["in"], handler, max_deliveries=3)) as manager:
        await publish(client, keys, "in", 4)
        await wait_for(lambda: _len(client, keys.dlq, 1))
        await wait_for(lambda: _len(client, keys.stream("out"), 3))
        assert attempts == [1, 2, 3]
        (_id, entry), = await client.xrange(keys.dlq)
        assert entry["deliveries"] == "3"
        assert entry["reason_code"] == "max_deliveries_exceeded"
        assert "always fails" in entry["error"]
        assert CODEC.decode(entry, "in").data == {"n": 0}, "the original fields are kept"
        assert manager.get_status()["w"]["errors"] == 3


async def test_reject_dead_letters_at_once(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)

    async def handler(msg: Message) -> None:
        raise Reject("invalid_input", "field x is wrong")

    async with running(stream_worker("w", client, keys, ["in"], handler)):
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _len(client, keys.dlq, 1))
        (_id, entry), = await client.xrange(keys.dlq)
        assert entry["reason_code"] == "invalid_input" and entry["deliveries"] == "1"


async def test_dead_consumer_entries_claimed_after_visibility_timeout(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    await client.xgroup_create(keys.stream("in"), "w", id="0", mkstream=True)
    await publish(client, keys, "in", 5)
    # A consumer that reads and dies: its entries stay pending under its name.
    await client.xreadgroup("w", "dead-consumer", {keys.stream("in"): ">"}, count=5)
    worker = stream_worker("w", client, keys, ["in"], relay("out"), visibility_timeout=0.5)
    async with running(worker):
        await wait_for(lambda: _len(client, keys.stream("out"), 5), timeout=10)
        assert await outputs_by_n(client, keys, "out") == {i: 1 for i in range(5)}
        pending = await client.xpending(keys.stream("in"), "w")
        assert pending["pending"] == 0


async def test_long_handler_keeps_its_entry(client: aioredis.Redis, prefix: str) -> None:
    """A handler running past the visibility timeout is not claimed by another consumer."""
    keys = StreamKeys(prefix)
    slow = Counting(delay=1.5)
    first = stream_worker("w", client, keys, ["in"], slow, visibility_timeout=0.4, claim_interval=0.1)
    second = stream_worker("w", client, keys, ["in"], slow, visibility_timeout=0.4, claim_interval=0.1)
    async with running(first, _renamed(second)):
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _len(client, keys.stream("out"), 1), timeout=10)
        assert slow.calls == 1
        assert await client.xlen(keys.stream("out")) == 1


def _renamed(worker: object) -> object:
    """Register a second instance of the same group under another manager key."""

    class Alias:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        @property
        def name(self) -> str:
            return "w-second"

        def __getattr__(self, attr: str) -> object:
            return getattr(self.inner, attr)

    return Alias(worker)


async def test_server_restart_loses_nothing(own_server: object, prefix: str) -> None:
    from printery.servers.process import ServerProcess
    from printery.transport.connection import connect

    assert isinstance(own_server, ServerProcess)
    client = connect(own_server.url, block_ms=100)
    keys = StreamKeys(prefix)
    worker = stream_worker("w", client, keys, ["in"], relay("out"), concurrency=2)
    try:
        async with running(worker):
            await publish(client, keys, "in", 1000)
            await wait_for(lambda: _len(client, keys.stream("out"), 100), timeout=20)
            await asyncio.to_thread(own_server.stop)
            await wait_for(lambda: _async(not worker.connected), timeout=10, message="disconnect noticed")
            await asyncio.to_thread(own_server.start)
            await publish(client, keys, "in", 1000, start=1000)
            await wait_for(lambda: _len(client, keys.stream("out"), 2000), timeout=60)
            counts = await outputs_by_n(client, keys, "out")
            assert set(counts) == set(range(2000))
            duplicates = {n: c for n, c in counts.items() if c > 1}
            # appendfsync everysec may lose the last second of acks on a SIGTERM-less crash, but
            # a clean stop flushes: every entry must appear exactly once.
            assert not duplicates
            await wait_for(lambda: _async(worker.connected), timeout=10)
    finally:
        await client.aclose()


async def _async(value: bool) -> bool:
    return value


async def test_retry_delay_overrides_the_backoff(client: aioredis.Redis, prefix: str) -> None:
    """``Retry(delay=0)`` comes back at once although the worker's backoff is a minute;
    the retry is a counted delivery. (Were the delay ignored, the bounded wait fails.)"""
    import pytest

    from printery.base.errors import Retry

    keys = StreamKeys(prefix)
    seen: list[int] = []

    async def handle(msg: Message) -> Output:
        seen.append(msg.deliveries)
        if msg.deliveries == 1:
            raise Retry("the model API said: try again", delay=0)
        return Output("out", msg.data)

    worker = stream_worker("w", client, keys, ["in"], handle,
                           retry_backoff_ms=60_000, retry_backoff_cap_ms=60_000)
    async with running(worker):
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _len(client, keys.stream("out"), 1), timeout=10)
    assert seen == [1, 2]
    with pytest.raises(ValueError):
        Retry(delay=-1)
