"""Helpers for tests of printery and of pipelines built on it: a real server, unique
prefixes, bounded waits. Public, so users test their own pipelines the same way."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def unique_prefix(label: str = "t") -> str:
    """A stream prefix no other test uses: isolation without flushing the server."""
    return f"test:{label}:{uuid.uuid4().hex[:12]}"


async def wait_for(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Poll ``probe`` until it returns a truthy value; raise TimeoutError after ``timeout``.

    For state that lives in Redis, where there is no event to await: the wait is bounded,
    so a broken build fails fast instead of hanging.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not reached within {timeout}s (last: {value!r})")
        await asyncio.sleep(interval)


def wait_for_sync(
    probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"
) -> T:
    """Blocking twin of :func:`wait_for`, for subprocess tests."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not reached within {timeout}s (last: {value!r})")
        time.sleep(interval)
