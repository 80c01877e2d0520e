"""The process registry against a real server: beats appear, expire and are removed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from printery.base.errors import ConfigError
from printery.runtime.departed import owner
from printery.servers.process import ServerProcess, free_port
from printery.service.departed import live_owners, remove_departed
from printery.service.registry import ProcessRegistry, list_processes
from printery.wire.keys import StreamKeys


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("registry"), appendonly=False)
    process.start()
    yield process
    process.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(server.url)
    yield connection
    await connection.aclose()


@pytest.fixture
def keys() -> StreamKeys:
    # A fresh prefix per test instead of FLUSHALL: tests never see each other's keys.
    return StreamKeys(f"test:{uuid.uuid4().hex}")


def status(pid: int = 1234) -> dict[str, Any]:
    return {
        "host": "host-a",
        "pid": pid,
        "started_at": "2026-01-01T00:00:00.000Z",
        "workers": {"validator": {"state": "running", "processed": 3}},
    }


async def wait_until(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Poll an async predicate until true; bounded, so a broken registry fails, not hangs."""
    for _ in range(250):  # 5 s at most
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in 5 s")


async def test_beat_makes_the_process_visible(client: aioredis.Redis, keys: StreamKeys) -> None:
    registry = ProcessRegistry(client, keys, "proc-1")

    await registry.beat(status())

    assert await list_processes(client, keys) == [{**status(), "process_id": "proc-1"}]
    ttl_ms = await client.pttl(keys.process("proc-1"))
    assert 0 < ttl_ms <= 15_000


async def test_a_process_that_stops_beating_disappears(
    client: aioredis.Redis, keys: StreamKeys
) -> None:
    registry = ProcessRegistry(client, keys, "proc-1", ttl=0.3, interval=0.1)
    await registry.beat(status())
    assert len(await list_processes(client, keys)) == 1

    async def gone() -> bool:
        return await list_processes(client, keys) == []

    await wait_until(gone)


async def test_remove_deletes_at_once(client: aioredis.Redis, keys: StreamKeys) -> None:
    registry = ProcessRegistry(client, keys, "proc-1")
    other = ProcessRegistry(client, keys, "proc-2")
    await registry.beat(status(1))
    await other.beat(status(2))

    await registry.remove()

    assert [p["process_id"] for p in await list_processes(client, keys)] == ["proc-2"]


async def test_list_skips_garbage_and_reads_every_key(
    client: aioredis.Redis, keys: StreamKeys
) -> None:
    # More keys than one SCAN step and one MGET batch hold.
    for index in range(450):
        await ProcessRegistry(client, keys, f"p{index:03d}").beat(status(index))
    await client.set(keys.process("not-json"), b"\xff{")
    await client.set(keys.process("a-list"), b"[1, 2]")
    await cast("Awaitable[int]", client.hset(keys.process("a-hash"), "k", "v"))
    await client.set(keys.stream("unrelated"), b"{}")
    await client.zadd(keys.processes, {"not-json": 1, "a-list": 1, "a-hash": 1, "gone": 1})

    found = await list_processes(client, keys)

    assert [p["process_id"] for p in found] == [f"p{index:03d}" for index in range(450)]


async def test_run_beats_until_cancelled(client: aioredis.Redis, keys: StreamKeys) -> None:
    registry = ProcessRegistry(client, keys, "proc-1", ttl=1, interval=0.05)
    beats = 0

    async def get_status() -> dict[str, Any]:
        nonlocal beats
        beats += 1
        if beats == 2:
            raise RuntimeError("a bug in the status builder")
        return {"beats": beats}

    async def beaten_past_the_failure() -> bool:
        found = await list_processes(client, keys)
        return bool(found) and found[0]["beats"] >= 3

    task = asyncio.create_task(registry.run(get_status))
    await wait_until(beaten_past_the_failure)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_run_survives_an_unreachable_server(keys: StreamKeys) -> None:
    dead = aioredis.Redis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2, socket_timeout=0.2
    )
    registry = ProcessRegistry(dead, keys, "proc-1", ttl=0.5, interval=0.05)
    calls = 0

    async def get_status() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {}

    task = asyncio.create_task(registry.run(get_status))
    try:
        deadline = time.monotonic() + 5
        while calls < 3:
            assert time.monotonic() < deadline, "the loop stopped beating"
            await asyncio.sleep(0.02)
        assert not task.done()
        await registry.remove()  # tolerated as well
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await dead.aclose()


def test_interval_must_be_shorter_than_ttl() -> None:
    client = aioredis.Redis()  # never connects: validation comes first
    with pytest.raises(ConfigError):
        ProcessRegistry(client, StreamKeys("p"), "x", ttl=1, interval=1)
    with pytest.raises(ConfigError):
        ProcessRegistry(client, StreamKeys("p"), "x", ttl=0, interval=0.1)


# -- consumers of departed processes (issue 14 item 13) ----------------------------------


async def test_departed_consumers_are_removed_unless_live_or_owning_entries(
    client: aioredis.Redis, keys: StreamKeys
) -> None:
    stream = keys.stream("in")
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    await client.xadd(stream, {"n": "1"})
    # host-a:1 read the entry and never acked it; host-a:2 and host-b:3 read nothing;
    # host-b:3 is registered (alive); "external" is not a printery consumer name.
    await client.xreadgroup("g", "host-a:1:w:0", {stream: ">"})
    for name in ("host-a:2:w:0", "host-a:2:w:1", "host-b:3:w:0", "external"):
        await client.xreadgroup("g", name, {stream: ">"})
    await ProcessRegistry(client, keys, "host-b:3:x").beat({"host": "host-b", "pid": 3})
    live = live_owners(await list_processes(client, keys))
    assert live == {"host-b:3"}

    def gone(who: str) -> bool:
        return who not in live

    # Idle too short: nothing goes.
    assert await remove_departed(client, [(stream, "g")], gone, min_idle=60) == []
    removed = await remove_departed(
        client, [(stream, "g"), (keys.stream("missing"), "g")], gone, min_idle=0)
    assert sorted(name for _, _, name in removed) == ["host-a:2:w:0", "host-a:2:w:1"]
    left = {_name(c["name"]): int(c["pending"]) for c in await client.xinfo_consumers(stream, "g")}
    assert left == {"host-a:1:w:0": 1, "host-b:3:w:0": 0, "external": 0}


def test_consumer_owner_is_host_and_pid() -> None:
    assert owner("web-1.example:4242:dependency-checker:3") == "web-1.example:4242"
    assert owner("external") is None and owner("a:b:c:d") is None
    # A worker whose name holds colons (a Map's each and collector) is still its process's.
    assert owner("web-1:4242:pages:each:0") == "web-1:4242"
    assert owner("web-1:4242:pages:collect:12") == "web-1:4242"


def _name(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
