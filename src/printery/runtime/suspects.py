"""A crash blames the crasher (reference: failures): after a process's death, the entries it
held are suspects, each runs alone, and a death counts only against the entry that ran
alone.

A process that dies (``os._exit``, a native crash, an OOM kill) writes nothing, and it may
have had several calls in flight: nothing says which one killed it. So a death among
several counts against none of them. What the group knows lives in the server, one record
per entry (:meth:`~printery.wire.keys.StreamKeys.suspect`), because the process that knew
anything is gone:

* a live consumer that hands entries back (a stop, a call given up on) first says so
  (``handed``): their next claim follows no death (:class:`HandBacks`);
* every entry claimed is screened (``suspects.lua``, :meth:`Suspects.screen`): handed back,
  nothing changes; its process died while it ran alone (``trial``), that delivery counts
  and it stays a suspect; else its process died while it may have run among others (or
  lost it: a lease that lapsed), that delivery does not count (its delivery count is set
  back by one) and it becomes a suspect;
* a suspect's next call runs alone in its process (:class:`Trial`,
  :mod:`printery.runtime.alone`), its record marked with its consumer (``trial.lua``)
  before it starts. Its process dying then is its own death, counted by the next claim; a
  call that ends (returns, raises, is cancelled or given up on) with its process alive
  clears the record: no suspect any more, its retries run as any entry's.

So an entry that kills its process is dead-lettered (``max_deliveries_exceeded``) once its
deaths while it ran alone, with its other failures, pass ``max_deliveries``; the entries
that were in flight beside it finish. A kill -9 from outside during a trial counts one
delivery against the entry on trial, as any death counted before. A claimer tells deaths
apart by these records only, so a process with no records left (expired after the record
ttl) is taken as having died among others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from weakref import WeakKeyDictionary

import structlog

from printery.runtime.alone import Alone
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Message
from printery.store.outage import Outage
from printery.transport.connection import Redis
from printery.transport.scripts import Scripts, script
from printery.transport.streams import Leases
from printery.wire.keys import StreamKeys

__all__ = ["HandBacks", "Suspects", "Trial"]

log = structlog.get_logger("printery.worker")

SCREEN_LUA = script("suspects")
TRIAL_LUA = script("trial")


class Suspects:
    """What ``worker``'s group knows of how its entries' deliveries ended (``keys``: the
    whole keyspace; each entry's record is in its stream's partition)."""

    def __init__(self, worker: str, *, client: Redis, keys: StreamKeys, record_ttl: float) -> None:
        self.worker = worker
        self.client = client
        self.scripts = Scripts(client)
        self.keys = keys
        self.ttl_ms = int(record_ttl * 1000)
        #: The suspects held now, each with its trial (taken by its next call:
        #: :class:`~printery.policies.trial.Trials`).
        self.trials: WeakKeyDictionary[Delivery, Trial] = WeakKeyDictionary()
        #: The trials' watchers (a reference, so none is collected while it waits).
        self.watching: set[asyncio.Task[None]] = set()

    def record(self, stream: str, entry_id: str) -> str:
        return self.keys.at(self.keys.locate(stream)[0]).suspect(self.worker, stream, entry_id)

    async def first(
        self, batch: Sequence[Delivery], connectivity: Outage,
        then: Callable[[Sequence[Delivery]], Awaitable[None]],
    ) -> None:
        """Screen a claimed batch, then take it through the pipeline (``then``)."""
        await self.screen(batch, connectivity)
        await then(batch)

    async def screen(self, batch: Sequence[Delivery], connectivity: Outage) -> None:
        """Screen entries one consumer claimed from one stream: each gets the delivery count
        that counts, and a suspect its :class:`Trial`. An entry lost meanwhile is left
        as it is (its commit is fenced)."""
        if not batch:
            return
        stream, consumer = batch[0].stream, batch[0].consumer.name
        records = [self.record(stream, delivery.entry_id) for delivery in batch]
        args = [self.worker, consumer, self.ttl_ms, *(delivery.entry_id for delivery in batch)]
        replies = await connectivity.retrying(
            lambda: self.scripts.call(SCREEN_LUA, [stream, *records], args))
        suspects = 0
        for delivery, record, (suspect, count) in zip(batch, records, replies, strict=True):
            if int(suspect) < 0:
                continue
            delivery.deliveries = int(count)
            if int(suspect):
                self.trials[delivery] = Trial(self, delivery, record, connectivity)
                suspects += 1
        if suspects:
            log.warning("entries held by a process that died are suspects: each runs alone",
                        worker=self.worker, stream=stream, consumer=consumer, count=suspects)

    async def handed_back(self, stream: str, ids: Sequence[str]) -> None:
        """Say that entries are handed back by a live process (before they are): their
        next claim follows no death."""
        if not ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for entry_id in ids:
            record = self.record(stream, entry_id)
            pipe.hset(record, "handed", "1")
            pipe.pexpire(record, self.ttl_ms)
        await pipe.execute()


class Trial:
    """A suspect's next call, run alone in its process (:meth:`begin`, from the entry
    pipeline before the call); over when the call gives its place back."""

    def __init__(self, suspects: Suspects, delivery: Delivery, record: str,
                 connectivity: Outage) -> None:
        self.suspects = suspects
        self.delivery = delivery
        self.record = record
        self.connectivity = connectivity

    async def begin(self, message: Message) -> None:
        """Once the call of ``message`` holding a place among its worker's running calls
        is the only one of its process, mark the record with its consumer; the trial ends
        (and the other calls start again) once the call gives its place back. The
        message is told it is a redelivery (its first partial retracts what an earlier
        delivery showed) whatever its count says."""
        delivery = self.delivery
        message.redelivered = True
        in_flight = delivery.consumer.in_flight
        alone = Alone.here()
        await alone.enter(in_flight)
        try:
            await self._mark("begin")
        except BaseException:
            in_flight.leave()
            alone.leave()
            raise
        log.info("a suspect runs alone", worker=self.suspects.worker, stream=delivery.stream,
                 entry_id=delivery.entry_id, deliveries=delivery.deliveries)
        watch = asyncio.get_running_loop().create_task(self._watch(alone))
        self.suspects.watching.add(watch)
        watch.add_done_callback(self.suspects.watching.discard)

    async def _watch(self, alone: Alone) -> None:
        """Until the call gives its place back (it returned, raised, was cancelled or
        given up on), then clear the record before any other call starts."""
        try:
            await self.delivery.consumer.in_flight.drained(0)
            await self._mark("end")
            log.info("a suspect ran alone and its process lives: cleared",
                     worker=self.suspects.worker, stream=self.delivery.stream,
                     entry_id=self.delivery.entry_id)
        except Exception as exc:  # the server gone as the worker stops: the record lapses
            log.warning("a suspect's record was not cleared", worker=self.suspects.worker,
                        entry_id=self.delivery.entry_id, error=str(exc))
        finally:
            alone.leave()

    async def _mark(self, mode: str) -> None:
        delivery, suspects = self.delivery, self.suspects
        args = [mode, delivery.consumer.name, suspects.worker, delivery.entry_id, suspects.ttl_ms]
        await self.connectivity.retrying(
            lambda: suspects.scripts.call(TRIAL_LUA, [self.record, delivery.stream], args))


class HandBacks(Leases):
    """Leases whose hand-backs say so first (:meth:`Suspects.handed_back`)."""

    def __init__(self, client: Redis, group: str, suspects: Suspects) -> None:
        super().__init__(client, group)
        self.suspects = suspects

    async def hand_back(self, stream: str, consumer: str, ids: Sequence[str], idle_ms: int) -> None:
        await self.suspects.handed_back(stream, ids)
        await super().hand_back(stream, consumer, ids, idle_ms)
