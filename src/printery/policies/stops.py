"""Stops: nothing of a stopped run goes on (docs/reference.md, Cancelling a run). A run
stops when it is cancelled, or when it fails in a pipeline with ``on_failure="cancel"``;
the server keeps the partition's stopped runs (``keys.stopped``) and this policy a copy,
read on every half second by :meth:`Stops.watch`:

* ``admit``: an entry of a stopped run is settled (acked, no handler call, no output),
  with no round trip: the copy says;
* ``wrap``: a call of a run that stops while it runs is cancelled (a model stream closes
  with its task) and ends settled: neither a retry nor a dead letter; its draft is
  retracted with ``cancelled``; the cost it reported is charged;
* ``on_commit``: the commit itself checks the run (:class:`StopCheck`), so a call that
  returns after the stop, in whatever process, writes none of its outputs, however late
  the copy here learns of it.

Compensation (an entry of ``run:cancelled`` or ``run:failed``, and what is written from
one: :func:`~printery.runtime.writes.is_compensation`) is never stopped."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from printery.policies.base import Batch, Call, Policy, acked
from printery.runtime import partials
from printery.runtime.accounting import Decided
from printery.runtime.consumer import Delivery
from printery.runtime.handler import HandlerResult, Message
from printery.runtime.writes import is_compensation
from printery.store import Redis
from printery.store.outage import Outage
from printery.transport.commit import EntryCommit, StopCheck
from printery.wire.keys import StreamKeys

__all__ = ["SETTLED", "STOP_POLL_S", "Stops"]

#: How often the stopped runs are read (s): a running call of a stopped run is cancelled
#: within this and a turn of its event loop.
STOP_POLL_S = 0.5
#: The outcome an entry of a stopped run is accounted as.
SETTLED = "settled"
#: The message of the cancellation of a call whose run stopped.
_STOPPED = "printery: its run stopped"



class Stops(Policy):
    name = "stops"

    def __init__(self, keys: StreamKeys, client: Redis, connectivity: Outage) -> None:
        self.keys = keys
        self.client = client
        self.connectivity = connectivity
        #: The partition's stopped runs, by when they stopped (ms, the server's clock).
        self.stopped: dict[str, float] = {}
        self._since = float("-inf")
        #: The running calls of each run: cancelled when it stops.
        self._running: dict[str, set[asyncio.Task[Any]]] = {}
        #: The tasks this policy cancelled (their cancellation is a stop, not a timeout).
        self._cancelled: set[asyncio.Task[Any]] = set()

    async def refresh(self) -> list[str]:
        """Read the runs stopped since the last read; cancel their running calls. The
        runs newly stopped."""
        found = await self.client.zrangebyscore(self.keys.stopped, self._since, "+inf",
                                                withscores=True)
        fresh = []
        for run, at in found:
            self._since = max(self._since, at)
            if run not in self.stopped:
                self.stopped[run] = at
                fresh.append(run)
                for task in self._running.get(run, ()):
                    self._cancelled.add(task)
                    task.cancel(_STOPPED)
        return fresh

    async def watch(self, closing: asyncio.Event) -> None:
        """Read the stopped runs every :data:`STOP_POLL_S` until ``closing``."""
        while not closing.is_set():
            await self.connectivity.retrying(self.refresh)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), STOP_POLL_S)

    def _stops(self, message: Message) -> bool:
        return message.correlation_id in self.stopped and not is_compensation(message)

    async def admit(self, batch: Batch) -> None:
        if not self.stopped:
            return
        kept = []
        for delivery, message in batch.entries:
            if self._stops(message):
                batch.decide(Decided(delivery, acked(delivery, message.envelope.idempotency_key),
                                     SETTLED, message))
            else:
                kept.append((delivery, message))
        batch.keep(kept)

    def wrap(self, call: Call) -> Call:
        running, cancelled = self._running, self._cancelled

        async def stoppable(delivery: Delivery, message: Message) -> HandlerResult:
            run = message.correlation_id
            if not run or is_compensation(message):
                return await call(delivery, message)
            task = asyncio.current_task()
            assert task is not None
            if run in self.stopped:  # it stopped between its admission and now
                return None
            calls = running.setdefault(run, set())
            calls.add(task)
            try:
                return await call(delivery, message)
            except asyncio.CancelledError as exc:
                if task not in cancelled:
                    raise
                task.uncancel()
                if message.streamed:
                    await partials.retract(message, exc)
                return None  # settled: acked, its cost charged, nothing written
            finally:
                cancelled.discard(task)
                calls.discard(task)
                if not calls:
                    running.pop(run, None)

        return stoppable

    def on_commit(self, message: Message, commit: EntryCommit, outcome: str) -> EntryCommit:
        run = message.correlation_id
        if not run or not commit.appends or is_compensation(message):
            return commit
        return commit._replace(stop=StopCheck(self.keys.stopped, self.keys.withheld, run))
