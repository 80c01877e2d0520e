"""`replay --from STEP` re-runs STEP and the steps downstream of it, not the siblings that
read the same stream: the docflow example (extract -> summarize || classify -> join ->
gate -> publish) replayed from summarize, on the real server with real workers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from examples import docflow

from printery import ConsumerSettings, StreamKeys, WorkerManager, replay
from printery.runs.replay import rerun_steps
from printery.testing import wait_for

DOC = {"doc_id": "inv-7", "text": "Invoice 7: two widgets, total 20 EUR."}


@pytest.fixture
async def keys(client: aioredis.Redis, prefix: str) -> AsyncIterator[StreamKeys]:
    keys = StreamKeys(prefix)
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in docflow.pipeline.build_workers(
        client=client, keys=keys, settings=ConsumerSettings(block_ms=100)
    ):
        manager.register(worker, deps)
    await manager.start_all()
    yield keys
    await manager.stop_all(2)


async def _of(client: aioredis.Redis, keys: StreamKeys, event_type: str, doc_id: str) -> list[dict[str, str]]:
    return [f for _, f in await client.xrange(keys.stream(event_type)) if f.get("doc_id") == doc_id]


def test_rerun_steps_are_the_step_and_what_follows_it() -> None:
    assert rerun_steps(docflow.pipeline, "summarize") == ["summarize", "join", "gate", "publish"]
    assert rerun_steps(docflow.pipeline, "gate") == ["gate", "publish"]


async def test_replay_from_a_step_does_not_rerun_its_siblings(client: aioredis.Redis,
                                                              keys: StreamKeys) -> None:
    await client.xadd(keys.stream("doc:submitted"), {"data": json.dumps(DOC)})
    await wait_for(lambda: _of(client, keys, "doc:published", "inv-7"), timeout=20)

    result = await replay(client, keys, docflow.pipeline, "inv-7", from_step="summarize")
    assert result.new_id == "inv-7-r1"
    assert result.reruns == ["summarize", "join", "gate", "publish"]
    [published] = await wait_for(lambda: _of(client, keys, "doc:published", "inv-7-r1"), timeout=20)
    assert published["replay_of"] == "inv-7" and published["producer"] == "publish"
    assert json.loads(published["data"])["label"] == "invoice"

    # summarize ran again; classify did not: its output for the new id is the original's
    # copy, written by the replay (only the join reads that stream: no replay_for).
    [summarized] = await _of(client, keys, "doc:summarized", "inv-7-r1")
    assert summarized["producer"] == "summarize"
    [classified] = await _of(client, keys, "doc:classified", "inv-7-r1")
    assert classified["producer"] == "printery-replay" and "replay_for" not in classified
    # The opening entry is for summarize and the join, whose group classify shares the stream with.
    [extracted] = await _of(client, keys, "doc:extracted", "inv-7-r1")
    assert extracted["replay_for"] == "summarize,join"
    assert await _of(client, keys, "doc:analyzed", "inv-7-r1")

    # classify acknowledged the copy meant for others: nothing of the new id is pending.
    for event_type in ("doc:extracted", "doc:classified"):
        for group in await client.xinfo_groups(keys.stream(event_type)):
            assert group["pending"] == 0, (event_type, group)
