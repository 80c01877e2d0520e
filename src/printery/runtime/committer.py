"""Group commit: commits of entries that finish at about the same time share one round
trip and one script run, while each entry stays atomic on its own (its outputs, ack and
marker, or nothing; fenced and duplicate-checked on its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from printery.transport.streams import COMMIT_LUA, ScriptChannel, Scripts

Call = tuple[Sequence[str], Sequence[Any]]

#: Entries per script run: bounds how long one run holds the server (other clients wait
#: while a script runs); a flush with more sends several runs in the same write.
MAX_ENTRIES_PER_RUN = 128


class GroupCommitter:
    """Queues commits and flushes everything queued in one write per wake-up.

    While a flush is on the wire the next commits queue up, so the batch grows with the
    load by itself and nothing waits for a timer. ``commit`` and ``commit_many`` are
    coroutine-safe; a failed round trip fails every call in it (the callers retry: the
    commit script is idempotent through its marker and fenced by ownership).
    """

    def __init__(self, scripts: Scripts) -> None:
        self._channel = ScriptChannel(scripts.client)
        self._queue: list[tuple[Sequence[Call], asyncio.Future[list[Any]]]] = []
        self._wake = asyncio.Event()

    async def commit(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Commit one entry; returns the script's result, raises its error."""
        (result,) = await self.commit_many([(keys, args)])
        if isinstance(result, Exception):
            raise result
        return result

    async def commit_many(self, calls: Sequence[Call]) -> list[Any]:
        """Commit entries (each one ``commit_args`` call); returns each result, or the
        exception of an entry that failed. Raises when the round trip itself failed."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((calls, future))
        self._wake.set()
        return await future

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                batch, self._queue = self._queue, []
                if batch:
                    await self._flush(batch)
        finally:
            await self._channel.close()

    async def _flush(self, batch: list[tuple[Sequence[Call], asyncio.Future[list[Any]]]]) -> None:
        calls = [call for group, _ in batch for call in group]
        runs = [_merge(calls[i : i + MAX_ENTRIES_PER_RUN])
                for i in range(0, len(calls), MAX_ENTRIES_PER_RUN)]
        try:
            replies = await self._channel.call_many(COMMIT_LUA, runs)
        except Exception as exc:  # connection trouble: every caller retries on its own
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        results: list[Any] = []
        for run, reply in zip(runs, replies, strict=True):
            entries = len(run[0]) // 2
            # A run that failed as a whole (not one entry of it) fails all its entries.
            results += reply if isinstance(reply, list) else [reply] * entries
        start = 0
        for group, future in batch:
            if not future.done():
                future.set_result(results[start : start + len(group)])
            start += len(group)

    def fail_pending(self, exc: BaseException) -> None:
        """On shutdown: wake every caller still waiting, so nothing hangs."""
        batch, self._queue = self._queue, []
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)


def _merge(calls: Sequence[Call]) -> Call:
    """Many entries' keys and arguments as the keys and arguments of one script run."""
    keys: list[str] = []
    args: list[Any] = []
    for entry_keys, entry_args in calls:
        keys += entry_keys
        args += entry_args
    return keys, args
