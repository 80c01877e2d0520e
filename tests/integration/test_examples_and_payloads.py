"""The README's example pipeline end to end, and large payloads travelling by reference."""

from __future__ import annotations

import json

import redis.asyncio as aioredis
from examples import docflow

from printery import Pipeline
from printery.runtime.handler import Message, Output
from printery.runtime.payloads import PayloadStore
from printery.servers.process import ServerProcess
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import pipeline_starter, publish, stream_worker


async def test_docflow_example_runs_end_to_end(server: ServerProcess, client: aioredis.Redis,
                                               prefix: str) -> None:
    outcomes = await docflow.run_once(server.url, prefix, docflow.SAMPLES)
    assert outcomes["invoice-1"]["outcome"] == "doc:published"
    assert outcomes["invoice-1"]["label"] == "invoice"
    # Unsure documents went to review; the demo's reviewer approved one with the label
    # corrected in the data (the run resumed with it) and rejected the other.
    assert outcomes["note-1"]["outcome"] == "doc:published"
    assert outcomes["note-1"]["label"] == "note"
    assert outcomes["spam-1"]["outcome"] == "doc:refused"
    assert outcomes["spam-1"]["status"] == "rejected"
    assert [r["code"] for r in outcomes["spam-1"]["reasons"]] == ["rejected_by_reviewer"]
    decided = [f["decision"] for _, f in await client.xrange(StreamKeys(prefix).review_decided)]
    assert sorted(decided) == ["approved", "rejected"]
    assert outcomes["letter-big"]["outcome"] == "doc:published"
    # The large document travelled between steps by reference: the entry stayed small.
    keys = StreamKeys(prefix)
    extracted = {f["doc_id"]: f for _, f in await client.xrange(keys.stream("doc:extracted"))}
    big = extracted["letter-big"]
    assert len(big["data"]) < 200
    ref = json.loads(big["data"])
    assert ref["$ref"].startswith("blob:") and ref["size"] > 65536
    assert await client.exists(keys.blob(ref["$ref"][5:]))
    costs = [json.loads(f["cost"]) for _, f in await client.xrange(keys.stream("doc:summarized"))]
    assert sum(c["tokens"] for c in costs) > 40000


async def test_one_mib_output_by_reference_and_blob_ttl(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    seen: list[int] = []

    async def grow(message: Message) -> Output:
        return Output("big", {"blob": "x" * 1_000_000})

    async def consume(message: Message) -> None:
        seen.append(len(message.data["blob"]))

    producer = stream_worker("grow", client, keys, ["in"], grow)
    producer.payloads = PayloadStore(client, keys, limit=2_000_000, ttl=1.0)
    consumer = stream_worker("eat", client, keys, ["big"], consume)
    consumer.payloads = PayloadStore(client, keys, limit=2_000_000)
    manager = WorkerManager()
    manager.register(producer)
    manager.register(consumer)
    await manager.start_all()
    try:
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _async(bool(seen)), timeout=10)
        assert seen == [1_000_000], "the consumer saw the full data"
        (_, entry), = await client.xrange(keys.stream("big"))
        assert len(entry["data"]) < 200, "the stream entry stays small"
        digest = json.loads(entry["data"])["$ref"][5:]
        ttl_ms = await client.pttl(keys.blob(digest))
        assert 0 < ttl_ms <= 1000
        await wait_for(lambda: _gone(client, keys.blob(digest)), timeout=5, message="blob expired")
    finally:
        await manager.stop_all(2)


async def test_forged_ref_to_missing_blob_goes_to_dlq(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)

    async def never(message: Message) -> None:
        raise AssertionError("handler must not see an unresolvable entry")

    manager = WorkerManager()
    manager.register(stream_worker("w", client, keys, ["in"], never))
    await manager.start_all()
    try:
        await client.xadd(keys.stream("in"),
                          {"data": json.dumps({"$ref": "blob:" + "0" * 64, "size": 10})})
        await wait_for(lambda: client.xlen(keys.dlq), timeout=10)
        (_, entry), = await client.xrange(keys.dlq)
        assert entry["reason_code"] == "blob_missing"
    finally:
        await manager.stop_all(2)


async def _gone(client: aioredis.Redis, key: str) -> bool:
    return not await client.exists(key)


async def _async(value: bool) -> bool:
    return value


async def test_a_result_over_the_inline_limit_is_its_data_not_its_reference(
    server: ServerProcess, client: aioredis.Redis, prefix: str
) -> None:
    """Before (found by a hostile run): ``Client.result`` gave a large outcome's
    ``{"$ref", "size"}``, as stored, where the reference promises the outcome's data."""
    pipeline = Pipeline("big", ingress=["ask"])

    @pipeline.step("write", consumes=["ask"], produces=["answer"])
    async def write(message: Message) -> Output:
        return Output("answer", {"text": "y" * 100_000})

    async with pipeline_starter(server.url, client, prefix, max_deliveries=2) as start:
        submitter = await start(pipeline)
        run_id = await submitter.submit({})
        result = await submitter.result(run_id, timeout=20)
    assert result.status == "answer" and result.data == {"text": "y" * 100_000}
    [answer] = [e for e in result.entries if e["stream"] == "answer"]
    assert answer["data"]["$ref"].startswith("blob:")  # the entry as stored
