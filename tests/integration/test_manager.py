"""WorkerManager against a real server: the seed's unit tests, by name."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from printery.base.errors import DependencyCycle
from printery.runtime.handler import Message, Output
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import PlainWorker, publish, relay, stream_worker


async def test_worker_manager_startup() -> None:
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def slow_ready() -> None:
        loop.call_later(0.2, gate.set)
        await gate.wait()

    base = PlainWorker("base", ready_after=slow_ready)
    other = PlainWorker("other", ready_after=slow_ready)
    dependent = PlainWorker("dependent")
    manager = WorkerManager()
    manager.register(dependent, depends_on=["base"])
    manager.register(base)
    manager.register(other)
    await asyncio.wait_for(manager.start_all(), 10)
    try:
        assert base.ready_at is not None and dependent.started_at is not None
        assert dependent.started_at >= base.ready_at, "dependent started before its dependency was ready"
        assert other.started_at is not None
        # Independent workers of one level start together, not one after the other.
        assert abs(other.started_at - base.started_at) < 0.1  # type: ignore[operator]
        assert manager.get_status()["dependent"]["state"] == "running"
    finally:
        await manager.stop_all(5)


def test_dependency_cycle_is_rejected_before_start() -> None:
    manager = WorkerManager()
    manager.register(PlainWorker("a"), depends_on=["b"])
    manager.register(PlainWorker("b"), depends_on=["c"])
    manager.register(PlainWorker("c"), depends_on=["a"])
    with pytest.raises(DependencyCycle) as info:
        manager.start_order()
    assert set(info.value.cycle) == {"a", "b", "c"}


async def test_worker_manager_shutdown(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    quick_started = asyncio.Event()
    slow_started = asyncio.Event()

    async def handler(msg: Message) -> Output:
        if msg.data["n"] == 0:
            quick_started.set()
            await asyncio.sleep(0.3)
        else:
            slow_started.set()
            await asyncio.sleep(60)
        return Output("out", msg.data)

    # Two calls at once (``in_flight``): batches of one consumer may reach their handlers
    # in either order (their record lookups go on connections of their own), and with one
    # call at a time the slow one could start first and hold the quick one back.
    worker = stream_worker("w", client, keys, ["in"], handler, prefetch=2, in_flight=2,
                           visibility_timeout=1.0)
    manager = WorkerManager()
    manager.register(worker)
    await manager.start_all()
    await publish(client, keys, "in", 2)
    await asyncio.wait_for(asyncio.gather(quick_started.wait(), slow_started.wait()), 10)
    await manager.stop_all(timeout=1.0)

    outputs = await client.xrange(keys.stream("out"))
    assert len(outputs) == 1, "the in-flight handler that finished within the timeout committed"
    pending = await client.xpending(keys.stream("in"), "w")
    assert pending["pending"] == 1, "the one still running at the timeout stays pending"

    # Another consumer claims it (it was handed back, so no need to wait out the timeout).
    survivor = stream_worker("w", client, keys, ["in"], relay("out"), visibility_timeout=1.0)
    other = WorkerManager()
    other.register(survivor)
    await other.start_all()
    try:
        await wait_for(lambda: client.xlen(keys.stream("out")), timeout=10)
        await wait_for(lambda: _xlen_is(client, keys.stream("out"), 2), timeout=10)
        assert (await client.xpending(keys.stream("in"), "w"))["pending"] == 0
    finally:
        await other.stop_all(5)


async def _xlen_is(client: aioredis.Redis, key: str, n: int) -> bool:
    return int(await client.xlen(key)) == n


async def test_worker_health_check(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    hung = asyncio.Event()

    async def handler(msg: Message) -> None:
        hung.set()
        await asyncio.Event().wait()  # never returns: a hung handler

    worker = stream_worker("w", client, keys, ["in"], handler, handler_timeout=0.2)
    manager = WorkerManager(health_check_interval=3600)
    manager.register(worker)
    await manager.start_all()
    try:
        assert (await manager.health_check())["w"] is True
        await publish(client, keys, "in", 1)
        await asyncio.wait_for(hung.wait(), 10)
        result = await wait_for(
            lambda: _unhealthy(manager), timeout=5, message="hung worker reported unhealthy"
        )
        assert result
        assert manager.get_status()["w"]["state"] == "unhealthy"
    finally:
        await manager.stop_all(0.5)


async def _true(value: bool) -> bool:
    return value


async def _unhealthy(manager: WorkerManager) -> bool:
    return not (await manager.health_check())["w"]


async def test_worker_restart(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    crashed = PlainWorker("crasher", crash=True)

    manager = WorkerManager(supervised=True, max_restarts=5, backoff_ms=10, health_check_interval=0.05)
    manager.register(crashed)
    relay_worker = stream_worker("relay", client, keys, ["in"], relay("out"))
    manager.register(relay_worker)
    await manager.start_all()
    try:
        await wait_for(lambda: _restarts_at_least(manager, "crasher", 2), timeout=10)
        # A restart is counted as it starts the worker again: its run follows.
        await wait_for(lambda: _true(crashed.runs >= 3), timeout=10, message="third run")
        # A crashing relay: the first run raises from its run loop, the restart processes.
        await publish(client, keys, "in", 3)
        await wait_for(lambda: _xlen_is(client, keys.stream("out"), 3), timeout=10)
    finally:
        await manager.stop_all(2)


async def test_stream_worker_restart_processes_later_entries(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    worker = stream_worker("relay", client, keys, ["in"], relay("out"))
    manager = WorkerManager(supervised=True, backoff_ms=10, health_check_interval=0.05)
    manager.register(worker)
    await manager.start_all()
    try:
        await publish(client, keys, "in", 2)
        await wait_for(lambda: _xlen_is(client, keys.stream("out"), 2), timeout=10)
        await manager.restart("relay")
        assert manager.get_status()["relay"]["restarts"] == 1
        await publish(client, keys, "in", 2, start=2)
        await wait_for(lambda: _xlen_is(client, keys.stream("out"), 4), timeout=10)
    finally:
        await manager.stop_all(2)


async def _restarts_at_least(manager: WorkerManager, name: str, n: int) -> bool:
    return int(manager.get_status()[name]["restarts"]) >= n


async def test_max_restart_limit(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    manager = WorkerManager(supervised=True, max_restarts=2, backoff_ms=10, health_check_interval=0.05)
    manager.register(PlainWorker("crasher", crash=True))
    manager.register(stream_worker("relay", client, keys, ["in"], relay("out")))
    await manager.start_all()
    try:
        await asyncio.wait_for(manager.failed.wait(), 10)
        status = manager.get_status()
        assert status["crasher"]["state"] == "failed"
        assert status["crasher"]["restarts"] == 2
        assert status["relay"]["state"] == "running"
        await publish(client, keys, "in", 5)
        await wait_for(lambda: _xlen_is(client, keys.stream("out"), 5), timeout=10)
    finally:
        await manager.stop_all(2)


async def test_standalone_failure_sets_failed() -> None:
    manager = WorkerManager(supervised=False, health_check_interval=0.05)
    manager.register(PlainWorker("crasher", crash=True))
    await manager.start_all()
    try:
        await asyncio.wait_for(manager.failed.wait(), 10)
        assert manager.get_status()["crasher"]["state"] == "failed"
        assert manager.get_status()["crasher"]["restarts"] == 0
    finally:
        await manager.stop_all(1)
