"""How entries reach a stream worker's consumers: read when new, claimed when left idle.

Two loops feed the entry pipeline and differ only in the command: each consumer's
blocking ``XREADGROUP`` of new entries (their first delivery), and a periodic
``XAUTOCLAIM`` of entries idle past the visibility timeout because their consumer died
(with Redis's delivery count, docs/reference.md, Failures). Both stop at the stop signal
and pass each batch to ``accept``. They live apart from the stream worker, which wires
them to a run and starts and stops it, so that what comes in and a run's lifecycle are
read one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass

import structlog

from printery.base._util import wait_event
from printery.base.worker import RunContext, WorkerStats
from printery.runtime.consumer import Consumer, ConsumerSettings
from printery.runtime.departed import died_here
from printery.store.outage import Outage
from printery.transport.channel import Command, DirectChannel
from printery.transport.connection import Redis
from printery.transport.streams import (
    CONNECTION_ERRORS,
    GroupGone,
    claim_from,
    claim_idle,
    delivery_counts,
    pending_holders,
    read_new,
)

log = structlog.get_logger("printery.worker")

#: Takes a batch one consumer now holds: its stream, ``(id, fields, deliveries)``, and
#: whether no run was at a hard limit of its budget as it was read (False: not known).
Accept = Callable[[Consumer, str, list[tuple[str, dict[str, str] | None, int]], bool], None]


@dataclass(slots=True)
class Intake:
    """The read and claim loops of one run of the worker whose group is ``group``.

    ``prepare`` (re)creates the group when a read finds it gone; ``closing`` stops a loop
    that lost its cancellation at its next turn; ``stats`` gets the pending count the
    claim loop reads.
    """

    group: str
    _: KW_ONLY
    client: Redis
    consumers: Sequence[Consumer]
    settings: ConsumerSettings
    ctx: RunContext
    closing: asyncio.Event
    connectivity: Outage
    prepare: Callable[[], Awaitable[None]]
    accept: Accept
    stats: WorkerStats

    async def read(self, consumer: Consumer, streams: Sequence[str],
                   over_counts: Sequence[Command] = ()) -> None:
        """``consumer``'s blocking reads of new entries of ``streams``, while it has room.
        ``over_counts``: the commands counting the runs at a hard limit of their budget in
        the partitions of ``streams`` (``ZCARD``), sent with every read: when each is 0,
        the batch needs no check of its runs' budgets before handling (one round trip
        less per batch of a step with budgets)."""
        ctx, closing, connectivity, failures = self.ctx, self.closing, self.connectivity, 0
        channel = DirectChannel(self.client)  # the consumer's own connection for its reads
        try:
            while not (ctx.stopping.is_set() or closing.is_set()):
                ctx.beat()
                if consumer.free == 0:
                    consumer.room.clear()
                    await wait_event(consumer.room, self.settings.block_ms / 1000)
                    continue
                try:
                    reply, counts = await read_new(
                        channel, self.group, consumer.name, streams, count=consumer.read_count,
                        block_ms=self.settings.block_ms, also=over_counts)
                except CONNECTION_ERRORS as exc:
                    failures += 1
                    await connectivity.trouble(exc, failures)
                    continue
                except GroupGone:
                    await connectivity.retrying(self.prepare)  # the stream was deleted
                    continue
                if failures:
                    failures = 0
                    connectivity.restored()
                none_over = bool(counts) and all(count == 0 for count in counts)
                for stream, entries in reply:
                    self.accept(consumer, stream, [(eid, fields, 1) for eid, fields in entries],
                                none_over)
        finally:
            await channel.close()

    async def claim(self, streams: Sequence[str]) -> None:
        """Claim entries of ``streams`` idle past the visibility timeout, and at once
        those of a consumer whose process on this host died, every claim interval (the
        first at start), and count what the group has pending."""
        min_idle = int(self.settings.visibility_timeout * 1000)
        while not (self.ctx.stopping.is_set() or self.closing.is_set()):
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._claim_once(streams, min_idle)
                pending = 0
                for stream in streams:
                    count, holders = await pending_holders(self.client, stream, self.group)
                    pending += count
                    for holder in holders:
                        if died_here(holder):
                            await self._claim_from(stream, holder)
                self.stats.pending = pending
            await wait_event(self.ctx.stopping, self.settings.effective_claim_interval)

    async def _claim_from(self, stream: str, dead: str) -> None:
        """Claim the entries of ``stream`` that the consumer ``dead`` (of a process of
        this host that is gone) holds, as much as our consumers have room for."""
        for consumer in self.consumers:
            if consumer.free == 0 or self.ctx.stopping.is_set():
                continue
            claimed = await claim_from(self.client, stream, self.group, consumer.name, dead,
                                       consumer.free)
            if claimed is None:
                return
            if not claimed:
                continue
            counts = await delivery_counts(self.client, stream, self.group, [e for e, _ in claimed])
            log.info("claimed the entries of a process that died", worker=self.group,
                     consumer=consumer.name, died=dead, count=len(claimed))
            self.accept(consumer, stream, [(eid, f, counts.get(eid, 1)) for eid, f in claimed], False)

    async def _claim_once(self, streams: Sequence[str], min_idle: int) -> None:
        for stream in streams:
            for consumer in self.consumers:
                if consumer.free == 0 or self.ctx.stopping.is_set():
                    continue
                claimed = await claim_idle(self.client, stream, self.group, consumer.name,
                                           min_idle, consumer.free)
                if not claimed:
                    break
                counts = await delivery_counts(self.client, stream, self.group, [e for e, _ in claimed])
                log.info("claimed idle entries", worker=self.group, consumer=consumer.name,
                         count=len(claimed))
                self.accept(consumer, stream, [(eid, f, counts.get(eid, 1)) for eid, f in claimed], False)
