"""What a stream worker's consumers hold: kept leased while it runs, let go as it stops.

docs/reference.md (Failures) asks two things of held entries that concern neither reading
nor handling them: nobody may claim a live one (its lease is renewed every third of the
visibility timeout, however long its handler runs), and none may wait out a visibility
timeout when the worker stops (entries whose handler has not started are handed back at
once, started ones may finish within the drain timeout, the rest are cancelled and handed
back). That is one job with its own state (the consumers, their leases, the limit gate's
slots), so it lives here and the stream worker only wires it to its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from printery.base._util import give_up, given_up, idle
from printery.base.errors import TIMEOUT_CANCEL
from printery.runtime.consumer import Consumer, ConsumerSettings, Delivery
from printery.runtime.limit_gate import LimitGate
from printery.transport.streams import CONNECTION_ERRORS, Leases


@dataclass(slots=True)
class Holdings:
    """The entries ``consumers`` hold: their leases (``leases``), the limit slots their
    handlers hold (``gate``), and their hand-back on stop."""

    consumers: Sequence[Consumer]
    leases: Leases
    settings: ConsumerSettings
    gate: LimitGate | None
    #: Gives up on a call that was cancelled at its timeout and still runs
    #: (:meth:`~printery.runtime.consume.EntryPipeline.abandon`).
    abandon: Callable[[Delivery], Awaitable[None]]

    async def keep(self, closing: asyncio.Event) -> None:
        """Renew every held entry's lease (and the slots of running handlers) every third
        of the visibility timeout, until ``closing`` is set; not the lease of a handler
        call past its timeout (one that ignores its cancellation: its entry is then
        claimed by another consumer, docs/reference.md)."""
        interval = max(0.05, self.settings.visibility_timeout / 3)
        while not closing.is_set():
            await idle(interval)
            if self.gate is not None:
                self.gate.renew()  # the slots of handlers running now, with their leases
            overdue = time.monotonic() - self.settings.timeout
            for consumer in self.consumers:
                for stream, ids in consumer.held_ids(overdue=overdue).items():
                    with contextlib.suppress(*CONNECTION_ERRORS):
                        await self.leases.renew(stream, consumer.name, ids)

    async def watch_timeouts(self, closing: asyncio.Event) -> None:
        """Cancel every handler call that has run past the step's timeout (reference: failures),
        until ``closing`` is set: the entry pipeline sees the cancellation as the
        attempt's failure (``reason_code`` ``timeout``). One sweep a second (or four per
        timeout when that is shorter) rather than a timer per call: the common call
        costs nothing but noting when it began. A call still running
        :attr:`~ConsumerSettings.abandon_after` seconds after its cancellation swallowed
        it: it is given up on (``abandon``), so that one stubborn call never holds its
        step, its entry or its run for ever."""
        timeout = self.settings.timeout
        interval = max(0.01, min(1.0, timeout / 4))
        while not closing.is_set():
            await idle(interval)
            now = time.monotonic()
            overdue, stubborn = now - timeout, now - timeout - self.settings.abandon_after
            for consumer in self.consumers:
                for delivery in list(consumer.held.values()):
                    if not 0.0 < delivery.began < overdue:
                        continue
                    task = delivery.task
                    if task is None or task.done():
                        continue
                    if not delivery.timed_out:
                        delivery.timed_out = True
                        task.cancel(TIMEOUT_CANCEL)
                    elif delivery.began < stubborn and not delivery.abandoned:
                        give_up(task)  # a stop does not wait for it
                        await self.abandon(delivery)

    async def hand_back(self, *, started: bool | None = None) -> None:
        """Make held entries (``started``: only those whose handler did or did not start)
        claimable by others now, not after the visibility timeout."""
        idle_ms = int(self.settings.visibility_timeout * 1000) + 1000
        for consumer in self.consumers:
            for stream, ids in consumer.held_ids(started=started).items():
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await self.leases.hand_back(stream, consumer.name, ids, idle_ms)

    async def drain(self, batches: Collection[asyncio.Task[None]], timeout: float) -> None:
        """Hand back entries whose handler has not started, let started ones (their
        ``batches``) finish up to ``timeout``; the caller cancels what is left, then hands
        it back and releases it (:meth:`hand_back`, :meth:`release`)."""
        for consumer in self.consumers:
            for delivery in list(consumer.held.values()):
                if delivery.started is None and delivery.task is not None:
                    delivery.task.cancel()
        await self.hand_back(started=False)
        # A call given up on meanwhile (at its timeout, during the drain) is not waited
        # for: looked for once a second.
        deadline = time.monotonic() + timeout
        while left := [batch for batch in batches if not batch.done() and not given_up(batch)]:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            await asyncio.wait(left, timeout=min(wait, 1.0))

    def release(self) -> None:
        """Let go of every delivery still held, once its entries were handed back."""
        for consumer in self.consumers:
            for delivery in list(consumer.held.values()):
                delivery.release()
