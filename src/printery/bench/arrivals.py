"""Arrivals: the last stage of every side is a sink that notes each event's arrival.

The bench's chain is the outside yardstick's (docs/reference.md, ``printery bench``): with
``--stages S`` there are S stages over the streams ``s0 .. s<S-1>``; stages ``0 .. S-2``
relay an entry to the next stream and stage ``S-1`` is a sink that acknowledges it and
notes ``(data, arrival time)`` in its process. So a run of S stages appends S entries
per event (the load and S-1 relays), for printery and the ceilings alike, and nothing
but the relay's own work sits in the measured path: the notes go to the server in
batches, every :data:`FLUSH_EVERY` seconds, as one entry per batch in
``<prefix>:arrivals`` and a count in ``<prefix>:arrived`` that the driver polls.

Arrival times are the sink's clock shifted to the server's (``offset_ms``), the same
clock the load stamps ``t`` with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from printery.base import _json
from printery.bench.names import BenchLayout
from printery.store import Redis

#: Seconds between two batches of notes sent to the server.
FLUSH_EVERY = 0.02
#: Entries per XRANGE while reading the notes back.
CHUNK = 2000


class ArrivalRecorder:
    """Notes arrivals in the sink's process and sends them in batches, off the relay's
    path (the yardstick's recorder does the same from a thread)."""

    def __init__(self, client: Redis, layout: BenchLayout, offset_ms: float) -> None:
        self.client = client
        self.layout = layout
        self.offset_ms = offset_ms
        self.notes: list[tuple[Any, float]] = []
        self._task: asyncio.Task[None] | None = None

    def note(self, data: Any) -> None:
        """``data`` (the entry's JSON text, or its decoded object) arrived now."""
        self.notes.append((data, time.time() * 1000 + self.offset_ms))

    def note_all(self, data: Sequence[Any]) -> None:
        """A batch arrived now."""
        now = time.time() * 1000 + self.offset_ms
        self.notes.extend((item, now) for item in data)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop flushing, then send what is left."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # a flush that failed is raised here, not lost
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self.flush()

    async def flush(self) -> None:
        notes, self.notes = self.notes, []
        if not notes:
            return
        rows = [[_json.loads(data) if isinstance(data, str | bytes) else data, at]
                for data, at in notes]
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(self.layout.arrivals, {"notes": _json.dumps(rows)})
            pipe.incrby(self.layout.arrived, len(rows))
            await pipe.execute()


async def wait_arrivals(
    client: Redis, layout: BenchLayout, events: int, *, stall_timeout: float
) -> tuple[int, int]:
    """Poll the count of arrivals until ``events`` arrived, or nothing arrived for
    ``stall_timeout`` s (a broken side must not hang the bench); returns the count and
    the number of polls (so command counts can leave them out)."""
    seen, last_change = -1, time.monotonic()
    polls = 0
    while True:
        count = int(await client.get(layout.arrived) or 0)
        polls += 1
        if count >= events:
            return count, polls
        now = time.monotonic()
        if count != seen:
            seen, last_change = count, now
        elif now - last_change > stall_timeout:
            return count, polls
        await asyncio.sleep(0.02)


@dataclass(slots=True)
class Arrivals:
    """What the sinks noted in a run."""

    latencies_ms: list[float] = field(default_factory=list)
    first_ms: float = 0.0
    last_ms: float = 0.0
    counts: dict[int, int] = field(default_factory=dict)

    def exactly_once(self, events: int) -> bool:
        """Every event ``0..events-1`` arrived, none twice, nothing else."""
        return len(self.counts) == events and all(
            self.counts.get(n) == 1 for n in range(events)
        )


async def read_arrivals(client: Redis, layout: BenchLayout, *, not_before_ms: float) -> Arrivals:
    """Read every note; latency counts from the later of the publish stamp and
    ``not_before_ms`` (a pre-loaded backlog waits for the start, which is not the relay's
    latency)."""
    result = Arrivals()
    cursor = "-"
    while True:
        batch: Any = await client.xrange(layout.arrivals, min=cursor, max="+", count=CHUNK)
        if not batch:
            return result
        for _entry_id, fields in batch:
            for data, arrived in _json.loads(fields["notes"]):
                n = int(data["n"])
                result.counts[n] = result.counts.get(n, 0) + 1
                result.latencies_ms.append(max(0.0, arrived - max(float(data["t"]), not_before_ms)))
                result.last_ms = max(result.last_ms, arrived)
                result.first_ms = min(result.first_ms or arrived, arrived)
        cursor = "(" + batch[-1][0]
