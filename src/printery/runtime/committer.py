"""Group commit: commits of handlers that finish at about the same time share one round
trip, while each one stays its own atomic script call (atomicity per entry holds)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from printery.transport.streams import COMMIT_LUA, Scripts


class GroupCommitter:
    """Queues commit-script calls and flushes them in one pipeline per wake-up.

    ``commit`` is coroutine-safe; a failed round trip fails every call in it (the callers
    retry: the commit script is idempotent through its marker and fenced by ownership).
    """

    def __init__(self, scripts: Scripts) -> None:
        self._scripts = scripts
        self._queue: list[tuple[Sequence[str], Sequence[Any], asyncio.Future[Any]]] = []
        self._wake = asyncio.Event()

    async def commit(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((keys, args, future))
        self._wake.set()
        return await future

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            if not batch:
                continue
            try:
                results = await self._scripts.call_many(COMMIT_LUA, [(k, a) for k, a, _ in batch])
            except Exception as exc:  # connection trouble: every caller retries on its own
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def fail_pending(self, exc: BaseException) -> None:
        """On shutdown: wake every caller still waiting, so nothing hangs."""
        batch, self._queue = self._queue, []
        for _, _, future in batch:
            if not future.done():
                future.set_exception(exc)
