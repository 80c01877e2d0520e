"""Group commit: commits of entries that finish at about the same time share one round
trip (one commit transaction per run of up to 128 entries), while each entry stays atomic
on its own (its outputs, ack and idempotency record, or nothing; fenced and
duplicate-checked on its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from printery.transport.streams import (
    CommitCall,
    DirectChannel,
    Scripts,
    commit_commands,
    commit_results,
    commit_run,
)

Call = CommitCall

#: Entries per script run: bounds how long one run holds the server (other clients wait
#: while a script runs); a flush with more sends several runs in the same write.
MAX_ENTRIES_PER_RUN = 128


class GroupCommitter:
    """Queues commits and flushes everything queued in one write per wake-up.

    While a flush is on the wire the next commits queue up, so the batch grows with the
    load by itself and nothing waits for a timer. ``commit`` and ``commit_many`` are
    coroutine-safe; a failed round trip fails every call in it (the callers retry: the
    commit script is idempotent through its record and fenced by ownership).
    """

    def __init__(self, scripts: Scripts, *, index_key: str, group: str, ttl_ms: int) -> None:
        self._channel = DirectChannel(scripts.client)
        self._header = (index_key, group, ttl_ms)
        self._queue: list[tuple[Sequence[Call], asyncio.Future[list[Any]]]] = []
        self._wake = asyncio.Event()
        self._busy = False

    async def commit(self, call: Call) -> Any:
        """Commit one entry; returns the script's result, raises its error."""
        (result,) = await self.commit_many([call])
        if isinstance(result, Exception):
            raise result
        return result

    async def commit_many(self, calls: Sequence[Call]) -> list[Any]:
        """Commit entries (each one ``commit_args`` call); returns each result, or the
        exception of an entry that failed. Raises when the round trip itself failed."""
        return await self.submit(calls)

    def submit(self, calls: Sequence[Call]) -> asyncio.Future[list[Any]]:
        """Queue entries for the next flush; the future resolves as :meth:`commit_many`
        returns. Awaiting it through ``asyncio.shield`` protects the commit from the
        caller's cancellation without a task of its own (shielding a coroutine makes one)."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((calls, future))
        self._wake.set()
        return future

    async def lead(self) -> None:
        """Flush from the caller's task when no flush is on the wire: at low load this
        saves the hand-over to the committer task, which is a wait behind everything else
        the event loop has to do. A flush already on the wire takes the queue next."""
        if self._busy or not self._queue:
            return
        await self._drain_queue(once=True)

    async def run(self) -> None:
        """The committer of last resort: flushes whatever no caller leads."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._busy and self._queue:
                    await self._drain_queue()
        finally:
            await self._channel.close()

    async def _drain_queue(self, *, once: bool = False) -> None:
        """Flush until the queue is empty (``once``: one flush, so a leading caller is
        held up by one round trip at most; the committer task takes what queued since)."""
        self._busy = True
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._flush(batch)
                if once:
                    break
        finally:
            self._busy = False
            if self._queue:
                self._wake.set()

    async def _flush(self, batch: list[tuple[Sequence[Call], asyncio.Future[list[Any]]]]) -> None:
        calls = [call for group, _ in batch for call in group]
        chunks = [calls[i : i + MAX_ENTRIES_PER_RUN]
                  for i in range(0, len(calls), MAX_ENTRIES_PER_RUN)]
        runs = [commit_run(*self._header, chunk) for chunk in chunks]
        try:
            replies = await self._channel.transact_many([commit_commands(run) for run in runs])
        except BaseException as exc:
            # Connection trouble, or the flushing task was cancelled mid-reply: every
            # caller retries on its own (the script is idempotent and fenced).
            failure = exc if isinstance(exc, Exception) else ConnectionError("commit interrupted")
            for _, future in batch:
                if not future.done():
                    future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        results: list[Any] = []
        for run, reply in zip(runs, replies, strict=True):
            # A run that failed as a whole (not one entry of it) fails all its entries.
            if isinstance(reply, Exception):
                results += [reply] * len(run.output_counts)
            else:
                results += commit_results(run, reply)
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

