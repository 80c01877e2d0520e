"""Following runs (``Client.result``/``watch``, the HTTP API's and the console's event
streams) through one shared read per partition, against a real server: many followers
cost one blocked connection, each gets exactly its run's entries, in order, with no gap
between its history and the live read, and a failure of the read reaches every follower."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from printery import Output, Pipeline
from printery.runs.reader import RunReader, RunResult
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix, wait_for
from printery.wire.keys import StreamKeys, partition_of

FOLLOWERS = 20


def _pipeline() -> Pipeline:
    p = Pipeline("tail", ingress=["job"])

    @p.step("work", consumes=["job"], produces=["done"])
    async def work(message: object) -> Output:  # never run: the test writes the entries
        raise AssertionError("not run")

    return p


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[tuple[ServerProcess, aioredis.Redis]]:
    """A server of this test alone: its blocked clients are the reader's."""
    server = ServerProcess(tmp_path / "server")
    server.start()
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield server, client
    finally:
        await client.aclose()
        server.stop()


async def _write(client: aioredis.Redis, keys: StreamKeys, run: str, event: str, n: int) -> str:
    return str(await client.xadd(keys.of(run).stream(event), {
        "data": json.dumps({"n": n}), "correlation_id": run, "type": event}))


def _now(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``check`` as the awaitable probe ``wait_for`` takes."""
    async def probe() -> bool:
        return check()
    return probe


@asynccontextmanager
async def _following(
    client: aioredis.Redis, keys: StreamKeys,
) -> AsyncIterator[tuple[RunReader, list[asyncio.Task[RunResult]]]]:
    """A reader and the list of its followers' tasks: cancelled, and the reader closed,
    at the end."""
    reader = RunReader(client, keys, _pipeline())
    followers: list[asyncio.Task[RunResult]] = []
    try:
        yield reader, followers
    finally:
        for task in followers:
            task.cancel()
        await reader.close()


def _assert_job_then_done(results: list[RunResult]) -> None:
    for n, result in enumerate(results):
        assert result.run_id == f"run-{n}"
        assert [(e["stream"], e["data"]["n"]) for e in result.entries] == [("job", n), ("done", n)]


async def _blocked(client: aioredis.Redis) -> int:
    return int((await client.info("clients"))["blocked_clients"])


async def test_many_followers_share_one_blocked_read(
    private: tuple[ServerProcess, aioredis.Redis],
) -> None:
    _, client = private
    async with _following(client, StreamKeys(unique_prefix("tail"))) as (reader, followers):
        keys = reader.keys
        followers += [asyncio.create_task(reader.result(f"run-{n}", timeout=30))
                      for n in range(FOLLOWERS)]
        await wait_for(_now(lambda: reader.tail.following() == FOLLOWERS), timeout=10)
        await wait_for(lambda: _blocked(client), timeout=5)
        assert await _blocked(client) == 1, "one read for every follower"
        assert reader.tail.reading() == 1
        for n in range(FOLLOWERS):
            await _write(client, keys, f"run-{n}", "job", n)
            await _write(client, keys, f"run-{n}", "done", n)
        _assert_job_then_done(await asyncio.wait_for(asyncio.gather(*followers), 30))
        assert reader.tail.following() == 0


async def test_a_read_ends_with_its_last_follower(
    private: tuple[ServerProcess, aioredis.Redis],
) -> None:
    _, client = private
    async with _following(client, StreamKeys(unique_prefix("tail"))) as (reader, followers):
        followers.append(asyncio.create_task(reader.result("run-1", timeout=30)))
        await wait_for(_now(lambda: reader.tail.reading() == 1), timeout=10)
        await _write(client, reader.keys, "run-1", "done", 1)
        await asyncio.wait_for(followers[0], 30)
        await wait_for(_now(lambda: reader.tail.reading() == 0), timeout=5)

        async def unblocked() -> bool:
            return await _blocked(client) == 0

        await wait_for(unblocked, timeout=5)


async def test_entries_written_while_followers_join_arrive_once_each(
    client: aioredis.Redis,
) -> None:
    """Followers join while their runs' entries are being written, some before, some
    during, some after their history is read: each gets both entries, once, in order."""
    async with _following(client, StreamKeys(unique_prefix("tail"))) as (reader, followers):
        for n in range(40):
            followers.append(asyncio.create_task(reader.result(f"run-{n}", timeout=30)))
            await _write(client, reader.keys, f"run-{n}", "job", n)
            if n % 3 == 0:
                await asyncio.sleep(0)  # let some followers get further before the outcome
            await _write(client, reader.keys, f"run-{n}", "done", n)
        _assert_job_then_done(await asyncio.wait_for(asyncio.gather(*followers), 30))


async def test_each_partition_is_read_once(client: aioredis.Redis) -> None:
    runs = [f"run-{n}" for n in range(12)]
    partitions = {partition_of(run, 3) for run in runs}
    async with _following(client, StreamKeys(unique_prefix("tail"), 3)) as (reader, followers):
        followers += [asyncio.create_task(reader.result(run, timeout=30)) for run in runs]
        await wait_for(_now(lambda: reader.tail.following() == len(runs)), timeout=10)
        assert reader.tail.reading() == len(partitions)
        for n, run in enumerate(runs):
            await _write(client, reader.keys, run, "done", n)
        results = await asyncio.wait_for(asyncio.gather(*followers), 30)
    assert [r.entries[0]["data"]["n"] for r in results] == list(range(len(runs)))


async def test_a_failing_read_reaches_every_follower(client: aioredis.Redis) -> None:
    """A stream replaced by a key of another type fails the shared read: every follower
    of the partition raises it (nothing is lost in the read's task)."""
    async with _following(client, StreamKeys(unique_prefix("tail"))) as (reader, followers):
        followers += [asyncio.create_task(reader.result(f"run-{n}", timeout=30))
                      for n in range(3)]
        await wait_for(_now(lambda: reader.tail.following() == 3), timeout=10)
        await client.set(reader.keys.stream("done"), "not a stream")
        await _write(client, reader.keys, "run-0", "job", 0)  # wakes the blocked read
        outcomes = await asyncio.wait_for(
            asyncio.gather(*followers, return_exceptions=True), 30)
    assert all(isinstance(o, ResponseError) and "WRONGTYPE" in str(o) for o in outcomes), outcomes
    assert reader.tail.reading() == 0 and reader.tail.following() == 0
