"""Partitioned streams on one server (docs/reference.md, Partitions): ``partitions = 3``,
hash tags are legal key text on a single server, so every property but the slots is
checked here.

A run lives in one partition (every entry, its join state, its idempotency records);
runs that hash apart land apart; a raw ``XADD`` in the wrong partition is routed to its
run's partition and handled there; an entry naming no run is handled where it is.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from printery import (
    Aggregator,
    Budget,
    ConsumerSettings,
    JoinState,
    Message,
    Output,
    Pipeline,
    WorkerManager,
)
from printery.runs.facade import Runs
from printery.runtime.payloads import PayloadStore
from printery.testing import wait_for
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys, partition_of
from support.spine import running_pipeline

PARTITIONS = 3
TYPES = ("job", "left-done", "right-done", "joined", "dlq")


def fan_pipeline() -> Pipeline:
    """job -> left, right -> join -> joined: a commit per step and a join per run."""
    p = Pipeline("fan", ingress=["job"])

    @p.step("left", consumes=["job"], produces=["left-done"])
    async def left(message: Message) -> Output:
        return Output("left-done", {"side": "left"})

    @p.step("right", consumes=["job"], produces=["right-done"])
    async def right(message: Message) -> Output:
        return Output("right-done", {"side": "right"})

    p.add(Aggregator("join", opens="job", opens_as="job",
                     branches={"left-done": "left", "right-done": "right"}, emits="joined",
                     policy=both, deadline=30).step())
    return p


def both(state: JoinState) -> dict[str, object] | None:
    """Decided once both branches arrived."""
    return {"status": "succeeded"} if {"left", "right"} <= set(state.arrived) else None


@pytest.fixture
def keys(prefix: str) -> StreamKeys:
    return StreamKeys(prefix, PARTITIONS)


@pytest.fixture
async def running(client: aioredis.Redis, keys: StreamKeys) -> AsyncIterator[Runs]:
    pipeline = fan_pipeline()
    manager = WorkerManager()
    settings = ConsumerSettings(block_ms=100, retry_backoff_ms=10, max_deliveries=2)
    for worker, deps in pipeline.build_workers(client=client, keys=keys, settings=settings):
        manager.register(worker, deps)
    await manager.start_all()
    runs = Runs(client, keys, pipeline, payload_limit=1_048_576)
    try:
        yield runs
    finally:
        await runs.close()
        await manager.stop_all(2)


def runs_in_each_partition() -> list[str]:
    """One run id per partition (ids that hash apart)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_of(f"run-{n}", PARTITIONS), f"run-{n}")
        n += 1
    return [found[k] for k in range(PARTITIONS)]


async def where(client: aioredis.Redis, keys: StreamKeys, run: str) -> dict[int, list[str]]:
    """Partition -> the event types of the run's entries found in it, over every stream
    of every partition."""
    placed: dict[int, list[str]] = {}
    for part in keys.each():
        for event_type in TYPES:
            for _, fields in await client.xrange(part.stream(event_type)):
                if fields.get("correlation_id") == run or run in fields.get("data", ""):
                    assert part.partition is not None
                    placed.setdefault(part.partition, []).append(event_type)
    return placed


async def test_every_entry_of_a_run_is_in_its_partition_and_runs_land_apart(
    client: aioredis.Redis, keys: StreamKeys, running: Runs
) -> None:
    runs = runs_in_each_partition()
    for run in runs:
        await running.submit({"n": 1}, run_id=run)
    for k, run in enumerate(runs):
        result = await running.reader.result(run, timeout=15)
        assert result.status == "succeeded", result
        placed = await where(client, keys, run)
        assert list(placed) == [k], placed  # only in its own partition
        assert sorted(placed[k]) == ["job", "joined", "left-done", "right-done"]
        # Its join state and idempotency records are its partition's keys too.
        assert await client.exists(keys.at(k).join("join", run)) == 1
        assert not await client.exists(keys.at((k + 1) % PARTITIONS).join("join", run))
        index = await client.hgetall(keys.at(k).idempotency_index("left"))
        assert index, "the idempotency index of partition k holds left's records"
    # Nothing leaked into the unpartitioned keys.
    assert await client.exists(f"{keys.prefix}:job", f"{keys.prefix}:joined") == 0


async def test_a_raw_xadd_to_the_wrong_partition_is_routed_and_handled(
    client: aioredis.Redis, keys: StreamKeys, running: Runs
) -> None:
    run = runs_in_each_partition()[1]  # belongs to partition 1
    wrong = keys.at(0).stream("job")
    await client.xadd(wrong, {"data": json.dumps({"correlation_id": run})})
    result = await running.reader.result(run, timeout=15)
    assert result.status == "succeeded"
    placed = await where(client, keys, run)
    assert set(placed) == {0, 1}
    assert placed[0] == ["job"], "only the misplaced entry itself stays in partition 0"
    assert sorted(placed[1]) == ["job", "joined", "left-done", "right-done"]
    # Acknowledged where it was found, by every group reading it: nothing left pending.
    for group in ("left", "right", "join"):
        assert (await client.xpending(wrong, group))["pending"] == 0
    assert await client.xlen(keys.at(1).stream("joined")) == 1


async def test_an_entry_naming_no_run_is_handled_in_its_partition(
    client: aioredis.Redis, keys: StreamKeys, running: Runs
) -> None:
    await client.xadd(keys.at(2).stream("job"), {"data": json.dumps({"anything": 1})})
    done = keys.at(2).stream("left-done")
    await wait_for(lambda: client.xlen(done), timeout=15)
    ((_, fields),) = await client.xrange(done)
    # The id each group makes up for it is one of the partition it was found in.
    assert partition_of(fields["correlation_id"], PARTITIONS) == 2
    for k in (0, 1):
        assert await client.xlen(keys.at(k).stream("left-done")) == 0


async def test_a_submit_key_without_a_run_id_makes_one_run(
    keys: StreamKeys, running: Runs
) -> None:
    first = await running.submit({"n": 1}, idempotency_key="order-42")
    again = await running.submit({"n": 2}, idempotency_key="order-42")
    assert again == first
    assert partition_of(first[0], PARTITIONS) == partition_of("order-42", PARTITIONS)
    assert (await running.reader.result(first[0], timeout=15)).status == "succeeded"


async def test_a_runs_large_output_is_a_blob_of_its_partition(
    client: aioredis.Redis, keys: StreamKeys
) -> None:
    p = Pipeline("big", ingress=["in"])

    @p.step("grow", consumes=["in"], produces=["out"])
    async def grow(message: Message) -> Output:
        return Output("out", {"text": "x" * 500})

    payloads = PayloadStore(client, keys, inline_limit=100)
    manager = WorkerManager()
    for worker, deps in p.build_workers(client=client, keys=keys, payloads=payloads,
                                        settings=ConsumerSettings(block_ms=100)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        run = runs_in_each_partition()[2]
        part = keys.of(run)
        await client.xadd(part.stream("in"), {"data": json.dumps({"correlation_id": run})})
        await wait_for(lambda: client.xlen(part.stream("out")), timeout=15)
        ((_, fields),) = await client.xrange(part.stream("out"))
        ref = PayloadStore.reference_of(fields["data"])
        assert ref is not None, fields
        assert await client.exists(part.blob(ref[0])) == 1
        assert await client.exists(keys.at(0).blob(ref[0])) == 0
    finally:
        await manager.stop_all(2)


async def test_a_runs_budget_is_charged_and_enforced_in_its_partition(
    client: aioredis.Redis, keys: StreamKeys
) -> None:
    p = Pipeline("spend", ingress=["job"], cost_units=["usd"], budget=Budget(usd=3, soft=0.5),
                 outcomes=())

    @p.step("work", consumes=["job"], produces=["done"], cost_units=["usd"])
    async def work(message: Message) -> Output:
        message.report_cost("usd", 1)
        return Output("done", {"n": message.data["n"]}, idempotency_key=f"done:{message.data['n']}")

    async with running_pipeline(p, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        run = runs_in_each_partition()[1]
        part = keys.of(run)
        for n in range(6):  # one at a time: the budget is checked before each call
            await client.xadd(part.stream("job"), {
                "data": json.dumps({"n": n}), "correlation_id": run,
                "idempotency_key": f"job:{n}"})
            await wait_for(lambda: _settled(client, part.stream("job"), "work"), timeout=15)
        assert decode_spent(await client.hget(part.budget(run), "usd")) == 3.0
        assert await client.xlen(part.stream("done")) == 3
        assert await client.xlen(part.stream("budget:warning")) == 1
        assert await client.xlen(part.stream("budget:exceeded")) == 1
        assert not await client.exists(keys.at(0).budget(run), keys.at(2).budget(run))


async def _settled(client: aioredis.Redis, stream: str, group: str) -> bool:
    (info,) = await client.xinfo_groups(stream)
    last = (await client.xinfo_stream(stream))["last-generated-id"]
    return bool(info["pending"] == 0 and info["last-delivered-id"] == last)
