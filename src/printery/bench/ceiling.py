"""The hand-written ceilings: the least a relay on redis-py can do per event.

One read loop per stage: ``XREADGROUP`` a batch, then one pipeline with an ``XADD`` per
entry to the next stage and a single ``XACK`` of the whole batch; the last stage notes the
batch's arrival and acknowledges it (the outside yardstick's relay: its fourth stage
records in memory). No decode, no
idempotency, no atomic commit, no fencing: it is what printery is measured against, not
something to run in production (a crash between the XADD and the XACK duplicates, and
nothing notices a consumer that died holding entries).

Two kinds, told apart only by what they carry:

* ``ceiling`` (the *same-entry* ceiling) relays each entry's fields unchanged: printery's
  own 10-field envelopes, as loaded for printery;
* ``ceiling_minimal`` relays one-field entries (just ``data``), writing ``{"data": ...}``
  and nothing else: what an outside harness's hand-written relay does, and so the
  figure an outside comparison of printery is taken against.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from printery.bench.arrivals import ArrivalRecorder
from printery.bench.names import BenchLayout
from printery.store import Redis
from printery.transport.streams import ensure_group


class CeilingRelay:
    """Relays stage ``i`` to stage ``i + 1`` for every stage and partition of ``layout``,
    in one process (one read loop per stage and partition);
    with ``minimal`` it writes only each entry's ``data`` field."""

    def __init__(
        self, client: Redis, layout: BenchLayout, recorder: ArrivalRecorder, *,
        batch: int, block_ms: int, minimal: bool = False,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.layout = layout
        self.batch = batch
        self.block_ms = block_ms
        self.minimal = minimal
        self.consumer = f"ceiling-{os.getpid()}"
        self.stopping = asyncio.Event()

    async def prepare(self) -> None:
        """Create every stage's group from id 0, so entries loaded earlier are seen."""
        for stage in range(self.layout.stages):
            for k in range(self.layout.partitions):
                await ensure_group(self.client, self.layout.stream(stage, k), self.layout.group(stage))

    async def run(self) -> None:
        """Relay until :attr:`stopping` is set (checked between batches)."""
        await asyncio.gather(*(self._relay(stage, k) for stage in range(self.layout.stages)
                               for k in range(self.layout.partitions)))

    async def _relay(self, stage: int, partition: int) -> None:
        """One stage of one partition (an entry stays in its partition, as printery's do)."""
        source = self.layout.stream(stage, partition)
        sink = self.layout.is_sink(stage)
        target = "" if sink else self.layout.stream(stage + 1, partition)
        group = self.layout.group(stage)
        minimal, recorder = self.minimal, self.recorder
        while not self.stopping.is_set():
            reply: Any = await self.client.xreadgroup(
                group, self.consumer, {source: ">"}, count=self.batch, block=self.block_ms
            )
            if not reply:
                continue
            entries = reply[0][1]
            pipe = self.client.pipeline(transaction=False)
            if sink:
                recorder.note_all([fields[b"data"] for _entry_id, fields in entries])
            else:
                for _entry_id, fields in entries:
                    pipe.xadd(target, {b"data": fields[b"data"]} if minimal else fields)
            pipe.xack(source, group, *(entry_id for entry_id, _ in entries))
            await pipe.execute()
