"""A background loop's pause ends the loop once its task is being cancelled, even when a
library swallowed the cancellation (redis-py may, mid-command): a service's shutdown
waited forever on a sweep that went round again."""

from __future__ import annotations

import asyncio

import pytest

from printery.base._util import idle


async def test_a_loop_whose_cancellation_was_swallowed_ends_at_its_next_pause() -> None:
    rounds = 0
    swallowing = asyncio.Event()

    async def sweep() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                swallowing.set()
                await asyncio.sleep(10)  # a command the cancel arrives in
            except asyncio.CancelledError:
                pass  # what a library did with it
            await idle(10)

    task = asyncio.create_task(sweep())
    await asyncio.wait_for(swallowing.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert rounds == 1
