"""Waiting out connection trouble: losing the server is not a worker failure (CONTRACT
§1); a worker logs once per outage, backs off, and carries on when it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from printery._util import wait_event
from printery.backoff import compute_backoff
from printery.transport.streams import CONNECTION_ERRORS

log = structlog.get_logger("printery.worker")

T = TypeVar("T")


class Connectivity:
    """One worker's view of the server: connected or not, and how to wait for it."""

    def __init__(self, worker: str, stopping: asyncio.Event) -> None:
        self.worker = worker
        self.stopping = stopping
        self.connected = True

    def restored(self) -> None:
        if not self.connected:
            log.info("server reachable again", worker=self.worker)
        self.connected = True

    async def trouble(self, exc: BaseException, failures: int) -> None:
        """Note a failed attempt (the first of an outage is logged) and wait the backoff,
        or less if the worker is stopping."""
        if self.connected:
            log.warning("server unreachable, backing off", worker=self.worker, error=str(exc))
        self.connected = False
        delay = compute_backoff(failures, base_ms=100, cap_ms=2000)
        await wait_event(self.stopping, delay)

    async def retrying(self, action: Callable[[], Awaitable[T]]) -> T:
        """``action()`` until it gets through; a connection error while the worker is
        stopping is raised (nothing waits for the server then)."""
        failures = 0
        while True:
            try:
                result = await action()
            except CONNECTION_ERRORS as exc:
                failures += 1
                await self.trouble(exc, failures)
                if self.stopping.is_set():
                    raise
                continue
            if failures:
                self.restored()
            return result
