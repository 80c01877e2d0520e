"""A cancellation redis-py loses still stops a task (printery/base/_util.py: check_cancelled,
idle, stop_tasks), on a real server.

redis-py 6.4 checks a pooled connection under ``asyncio.timeout(0)`` before each command,
and that swallows a cancellation requested just before it (CPython gh-134471): a task
looping on commands and cancelled at a random moment runs on in some of the rounds here
(measured: 7 % of them). A stop that waited on such a task hung the process at exit."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from printery.base._util import idle, stop_tasks, where
from printery.servers.process import ServerProcess
from printery.transport.connection import connect

ROUNDS = 200


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    """The client a worker uses (its pool, its timeouts), not the suite's plain one."""
    conn = connect(server.url)
    yield conn
    await conn.aclose()


async def _cancel_at_random(task: asyncio.Task[None]) -> None:
    await asyncio.sleep(random.random() * 0.002)  # somewhere in a command, or between two
    task.cancel()


async def test_a_loop_that_pauses_with_idle_ends_at_its_first_cancellation(
    client: aioredis.Redis, prefix: str
) -> None:
    async def loop() -> None:
        while True:
            await client.get(f"{prefix}:k")
            await idle(0)

    survived = 0
    for _ in range(ROUNDS):
        task = asyncio.create_task(loop())
        await _cancel_at_random(task)
        done, _ = await asyncio.wait([task], timeout=2)
        if not done:  # cancelled once only: the loop ran on
            survived += 1
            task.cancel()
            await asyncio.wait([task], timeout=2)
        assert task.done()
    assert survived == 0


async def test_stop_tasks_asks_again_until_a_task_that_lost_its_cancellation_ends(
    client: aioredis.Redis, prefix: str
) -> None:
    async def loop() -> None:  # no check of its own: only cancellations stop it
        while True:
            await client.get(f"{prefix}:k")

    tasks = [asyncio.create_task(loop()) for _ in range(ROUNDS // 4)]
    for _ in range(4):
        await asyncio.sleep(random.random() * 0.002)
    stuck = await stop_tasks(tasks, timeout=10, again_after=0.05)
    assert stuck == set() and all(task.cancelled() for task in tasks)


async def test_stop_tasks_gives_up_at_its_timeout_and_names_where_a_task_waits() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while True:
            try:
                await release.wait()
                return
            except asyncio.CancelledError:  # swallowed: a bug stop_tasks must survive
                continue

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    stuck = await stop_tasks([task], timeout=0.3, again_after=0.05)
    assert stuck == {task}
    assert where(task).startswith("wait (locks.py") and "stubborn (" in where(task)
    release.set()
    await asyncio.wait_for(task, timeout=2)
