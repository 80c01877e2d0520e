"""A side's keys removed once it ran, on one server or a cluster."""

from __future__ import annotations

import contextlib

from printery.store import Redis, ServerError


async def delete_prefix(client: Redis, prefix: str) -> None:
    """Remove the run's streams and markers, so repeated runs do not fill the server."""
    with contextlib.suppress(ServerError, OSError):
        batch: list[str] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await _unlink(client, batch)
                batch = []
        if batch:
            await _unlink(client, batch)


async def _unlink(client: Redis, keys: list[str]) -> None:
    """One UNLINK per key in a pipeline: on a cluster the keys are in many slots."""
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.execute_command("UNLINK", key)  # (a cluster pipeline's unlink() is a coroutine)
        await pipe.execute()
