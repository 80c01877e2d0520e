"""Where a pipeline's consumer groups start (docs/reference.md, Streams and entries;
Changing a pipeline), on a real server: at 0 on the first start, at the end of the stream
for a group added later, in the old group's place for a rename; the same answer for
processes starting at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis

from printery import (
    ConsumerSettings,
    Loop,
    Message,
    Output,
    Pipeline,
    PipelineError,
    Step,
    WorkerManager,
)
from printery.pipeline.dag import readers_of
from printery.servers.process import ServerProcess
from printery.service.groups import prepare_groups
from printery.testing import wait_for
from printery.transport.connection import connect
from printery.transport.groups import END, RENAMED, START, Reader, place_groups
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster


async def noop(message: Message) -> None:
    return None


def pipeline(*steps: tuple[str, Sequence[str], str | None]) -> Pipeline:
    p = Pipeline("p", ingress=["in"])
    for name, consumes, renamed_from in steps:
        p.add(Step(name, tuple(consumes), (), noop, renamed_from=renamed_from))
    return p


async def group(client: aioredis.Redis, stream: str, name: str) -> dict[str, object] | None:
    for info in await client.xinfo_groups(stream):
        if info["name"] == name:
            return dict(info)
    return None


async def test_first_start_reads_from_0_and_a_later_group_from_the_end(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    stream = keys.stream("in")
    before = [await client.xadd(stream, {"data": "{}"}) for _ in range(3)]
    await client.xgroup_create(stream, "someone-else", id="$")  # not of this pipeline
    await prepare_groups(client, keys, pipeline(("work", ["in"], None)))
    assert (await group(client, stream, "work"))["last-delivered-id"] == "0-0"
    assert (await group(client, stream, "work"))["lag"] == 3  # the first start reads them all

    later = await client.xadd(stream, {"data": "{}"})
    placed = await place_groups(client, keys, readers_of(pipeline(("work", ["in"], None),
                                                                  ("audit", ["in"], None))))
    assert [(p.reader.group, p.how, p.at) for p in placed] == [
        ("work", "exists", ""), ("audit", END, later)]
    audit = await group(client, stream, "audit")
    assert audit is not None and audit["last-delivered-id"] == later
    reply = await client.xreadgroup("audit", "c", {stream: ">"}, count=10)
    assert reply == []  # none of the history: 4 entries written before it
    assert before  # (they exist)


async def test_a_group_on_a_new_stream_of_a_pipeline_that_ran_starts_at_its_beginning(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    await prepare_groups(client, keys, pipeline(("work", ["in"], None)))
    placed = await place_groups(client, keys, [Reader("new-type", "reader")])
    assert [(p.how, p.at) for p in placed] == [(END, "0-0")]  # a stream made now: all of it


async def test_a_rename_keeps_the_position_and_the_pending_entries(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    stream = keys.stream("in")
    await prepare_groups(client, keys, pipeline(("old", ["in"], None)))
    ids = [await client.xadd(stream, {"data": f'{{"n": {n}}}'}) for n in range(4)]
    await client.xreadgroup("old", "host:1:old:0", {stream: ">"}, count=2)  # 2 delivered...
    await client.xack(stream, "old", ids[0])  # ... one of them done, one pending
    await client.xclaim(stream, "old", "host:1:old:0", 0, [ids[1]])  # delivered twice

    placed = await place_groups(client, keys, readers_of(pipeline(("new", ["in"], "old"))))
    assert [(p.how, p.at, p.moved) for p in placed] == [(RENAMED, ids[1], 1)]
    assert await group(client, stream, "old") is None  # removed
    pending = await client.xpending_range(stream, "new", "-", "+", 10)
    assert [(row["message_id"], row["consumer"], row["times_delivered"]) for row in pending] == [
        (ids[1], "host:1:old:0", 2)]
    fresh = await client.xreadgroup("new", "c", {stream: ">"}, count=10)
    assert [entry_id for entry_id, _ in fresh[0][1]] == ids[2:]  # not ids[0], done by old

    again = await place_groups(client, keys, readers_of(pipeline(("new", ["in"], "old"))))
    assert [p.how for p in again] == ["exists"]  # applied twice: nothing more
    assert len(await client.xpending_range(stream, "new", "-", "+", 10)) == 3


async def test_a_rename_of_a_group_that_was_never_there_is_a_new_group(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    first = await place_groups(client, keys, [Reader("in", "new", "old")])
    assert [p.how for p in first] == [START]  # the first start: from 0


async def test_groups_of_every_partition(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix, 3)
    for part in keys.each():
        await client.xadd(part.stream("in"), {"data": "{}"})
    await prepare_groups(client, keys, pipeline(("work", ["in"], None)))
    placed = await place_groups(client, keys, readers_of(pipeline(("work", ["in"], None),
                                                                  ("audit", ["in"], None))))
    assert sorted((p.stream, p.how) for p in placed if p.reader.group == "audit") == sorted(
        (part.stream("in"), END) for part in keys.each())
    for part in keys.each():
        assert (await group(client, part.stream("in"), "work"))["lag"] == 1
        assert (await group(client, part.stream("in"), "audit"))["lag"] == 0


async def test_a_group_destroyed_by_hand_comes_back_at_the_end(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    p = pipeline(("work", ["in"], None))
    await prepare_groups(client, keys, p)
    last = await client.xadd(keys.stream("in"), {"data": "{}"})
    await client.xgroup_destroy(keys.stream("in"), "work")  # a step removed...
    placed = await place_groups(client, keys, readers_of(p))  # ... and added again
    assert [(x.how, x.at) for x in placed] == [(END, last)]
    await client.delete(keys.stream("in"))  # a stream deleted: all of a new one is new
    assert [(x.how, x.at) for x in await place_groups(client, keys, readers_of(p))] == [
        (END, "0-0")]


async def test_processes_starting_at_once_on_a_fresh_server_agree_it_is_the_first_start(
        server: ServerProcess, prefix: str) -> None:
    clients = [aioredis.Redis.from_url(server.url, decode_responses=True) for _ in range(8)]
    try:
        for n in range(10):
            keys = StreamKeys(f"{prefix}-{n}", 2)
            for part in keys.each():
                await clients[0].xadd(part.stream("b"), {"data": "{}"})
            p = pipeline(("a", ["in"], None), ("b", ["b"], None), ("c", ["b"], None))
            await asyncio.gather(*(prepare_groups(c, keys, p) for c in clients))
            for part in keys.each():
                for name in ("b", "c"):
                    info = await group(clients[0], part.stream("b"), name)
                    assert info is not None and info["last-delivered-id"] == "0-0", (n, name)
    finally:
        for c in clients:
            await c.aclose()


def test_renamed_from_is_checked_when_the_pipeline_is_defined() -> None:
    with pytest.raises(PipelineError, match="renamed_from"):
        Step("a", ("in",), (), noop, renamed_from="a")
    p = pipeline(("a", ["in"], None))
    with pytest.raises(PipelineError, match="renamed_from='a'"):
        p.add(Step("b", ("in",), (), noop, renamed_from="a"))


async def test_on_a_cluster_each_partition_is_placed_on_its_own_master(
        cluster: ValkeyCluster, prefix: str) -> None:
    client = connect(cluster.url)
    keys = StreamKeys(prefix, 6)
    try:
        for part in keys.each():
            await client.xadd(part.stream("in"), {"data": "{}"})
        await prepare_groups(client, keys, pipeline(("old", ["in"], None)))
        for part in keys.each():
            await client.xreadgroup("old", "host:1:old:0", {part.stream("in"): ">"}, count=1)
        placed = await place_groups(client, keys, readers_of(pipeline(
            ("new", ["in"], "old"), ("audit", ["in"], None))))
        assert sorted({(p.reader.group, p.how, p.moved) for p in placed}) == [
            ("audit", END, 0), ("new", RENAMED, 1)]
        for part in keys.each():
            assert [g["name"] for g in await client.xinfo_groups(part.stream("in"))] == [
                "audit", "new"]
            assert (await client.xpending(part.stream("in"), "new"))["pending"] == 1
    finally:
        await client.aclose()


async def test_a_worker_of_the_old_version_still_running_after_a_rename_never_replays(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    stream = keys.stream("in")
    await client.xadd(stream, {"data": "{}"})
    await prepare_groups(client, keys, pipeline(("work", ["in"], None)))
    await place_groups(client, keys, readers_of(pipeline(("labour", ["in"], "work"))))
    last = await client.xadd(stream, {"data": "{}"})
    # the old process's read finds `work` gone: it creates it again, at the end
    back = await place_groups(client, keys, [Reader("in", "work")], recover=True)
    assert [(p.how, p.at) for p in back] == [(END, last)]
    # a group its record knows, whose stream was deleted, comes back at 0
    await client.delete(stream)
    await client.xadd(stream, {"data": "{}"})
    assert [p.how for p in await place_groups(client, keys, [Reader("in", "labour")],
                                              recover=True)] == [START]
    assert (await group(client, stream, "labour"))["lag"] == 1


async def test_a_worker_without_a_service_creates_its_groups_at_0_as_before(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    await client.xadd(keys.stream("in"), {"data": "{}"})
    for reader in ("a", "a", "b"):  # started, restarted, another added later
        await place_groups(client, keys, [Reader("in", reader)], recover=True)
    assert [(await group(client, keys.stream("in"), g))["lag"] for g in ("a", "b")] == [1, 1]
    assert not await client.exists(keys.known_groups)


async def test_an_application_running_build_workers_places_the_pipelines_groups(
        client: aioredis.Redis, prefix: str) -> None:
    """Not only the service: a pipeline run under the application's own manager
    (``build_workers``) that gets a new step does not hand it the retained history (it
    did: every worker alone created its group at 0)."""
    keys = StreamKeys(prefix)
    seen: list[str] = []

    def version(with_audit: bool) -> Pipeline:
        p = Pipeline("p", ingress=["in"])

        @p.step("work", consumes=["in"], produces=["done"])
        async def work(message: Message) -> Output:
            return Output("done", message.data)

        if with_audit:
            @p.step("audit", consumes=["in"], produces=["audited"])
            async def audit(message: Message) -> Output:
                seen.append(message.data["n"])
                return Output("audited", message.data)
        return p

    async def run(p: Pipeline, n: int) -> None:
        manager = WorkerManager()
        for worker, deps in p.build_workers(client=client, keys=keys, settings=ConsumerSettings(
                block_ms=50)):
            manager.register(worker, deps)
        await manager.start_all()
        try:
            await client.xadd(keys.stream("in"), {"data": json.dumps({"n": n})})
            async def done() -> bool:
                return await client.xlen(keys.stream("done")) >= n + 1  # the history too
            await wait_for(done, timeout=10, message="done")
            if p.steps.get("audit"):
                await wait_for(lambda: client.xlen(keys.stream("audited")), timeout=10,
                               message="audited")
        finally:
            await manager.stop_all(2)

    await client.xadd(keys.stream("in"), {"data": json.dumps({"n": -1})})  # before any start
    await run(version(False), 1)
    await run(version(True), 2)
    assert seen == [2]  # the entry written after the change, none of the history


async def test_a_renamed_loop_takes_over_its_input_and_replays_none_of_its_own_stream(
        client: aioredis.Redis, prefix: str) -> None:
    def loop_pipeline(name: str, renamed_from: str | None = None) -> Pipeline:
        p = Pipeline("p", ingress=["in"])
        p.add(Loop(name, consumes="in", produces="out", work=noop, validate=noop,
                   max_attempts=2, renamed_from=renamed_from))
        return p

    keys = StreamKeys(prefix)
    await prepare_groups(client, keys, loop_pipeline("draft"))
    runs = [await client.xadd(keys.stream("in"), {"data": "{}"}) for _ in range(3)]
    await client.xreadgroup("draft", "c", {keys.stream("in"): ">"}, count=3)
    await client.xack(keys.stream("in"), "draft", *runs)
    await client.xadd(keys.stream("draft:loop"), {"data": "{}"})  # an old run's attempt

    placed = await place_groups(client, keys, readers_of(loop_pipeline("drafter", "draft")))
    assert [(p.stream, p.how, p.at) for p in placed] == [
        (keys.stream("in"), RENAMED, runs[-1]), (keys.stream("drafter:loop"), END, "0-0")]
    assert (await group(client, keys.stream("in"), "drafter"))["lag"] == 0  # no run again
    assert await group(client, keys.stream("draft:loop"), "draft") is not None  # left alone


async def test_a_server_of_the_time_before_the_record_has_run_the_pipeline(
        client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    stream = keys.stream("in")
    await client.xgroup_create(stream, "work", id="0", mkstream=True)  # as the old version did
    last = await client.xadd(stream, {"data": "{}"})
    placed = await place_groups(client, keys, readers_of(pipeline(("work", ["in"], None),
                                                                  ("audit", ["in"], None))))
    assert [(p.how, p.at) for p in placed] == [("exists", ""), (END, last)]
    assert await client.hgetall(keys.known_groups) == {"in\twork": "exists", "in\taudit": f"end {last}"}
