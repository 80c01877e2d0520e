"""Load for a bench run and what arrived: events in, arrivals counted, exactly-once checked,
end-to-end latency from the publish stamp to the arrival in the final stream.

Every event is a printery envelope (so printery and the same-entry ceiling read the same
entries), or for the minimal ceiling an entry of the one field ``data``, whose ``data``
carries its number ``n`` and its publish time ``t`` in the server's clock (ms). Arrival
time is the final entry's id, which the server stamps when the last stage appends it:
no collector sits in the measured path. Ids have millisecond resolution, so an arrival is
taken as the middle of its millisecond.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from printery import _json
from printery.bench.layout import BenchLayout
from printery.envelope import Codec
from printery.store import Redis

CODEC = Codec()

#: Entries per pipeline while loading a backlog, and per XRANGE while reading arrivals.
CHUNK = 2000


async def server_offset_ms(client: Redis) -> float:
    """Server clock minus local clock, in ms (0 give or take on loopback; matters for a
    remote ``--redis-url``, whose ids are stamped by another machine's clock)."""
    before = time.time() * 1000
    seconds, micros = await client.time()
    after = time.time() * 1000
    return float(seconds) * 1000 + float(micros) / 1000 - (before + after) / 2


class EventFactory:
    """Envelopes of about ``payload_bytes`` of ``data`` each, stamped at creation; with
    ``minimal``, entries of that ``data`` field alone (what an outside producer writes)."""

    def __init__(
        self, layout: BenchLayout, payload_bytes: int, offset_ms: float, *,
        minimal: bool = False,
    ) -> None:
        self.layout = layout
        self.event_type = layout.event_type(0)
        self.offset_ms = offset_ms
        self.minimal = minimal
        overhead = len(_json.dumps({"n": 10**9, "t": 1.0e12 + 0.123, "pad": ""}))
        self.pad = "x" * max(0, payload_bytes - overhead)

    def stream(self, n: int) -> str:
        """Stage 0's stream of event ``n``'s partition."""
        return self.layout.stream(0, self.layout.partition(n))

    def fields(self, n: int, now_ms: float | None = None) -> dict[Any, Any]:
        stamp = (time.time() * 1000 if now_ms is None else now_ms) + self.offset_ms
        data = {"n": n, "t": stamp, "pad": self.pad}
        if self.minimal:
            return {"data": _json.dumps(data)}
        envelope = CODEC.new(self.event_type, None, correlation_id=self.layout.run_id(n),
                                producer="bench")
        return CODEC.encode(envelope, data_json=_json.dumps(data))


async def load_backlog(client: Redis, factory: EventFactory, events: int) -> None:
    """Append ``events`` entries to stage 0 before any relay reads."""
    for start in range(0, events, CHUNK):
        pipe = client.pipeline(transaction=False)
        for n in range(start, min(events, start + CHUNK)):
            pipe.xadd(factory.stream(n), factory.fields(n))
        await pipe.execute()


async def offer(client: Redis, factory: EventFactory, rate: float, duration: float) -> int:
    """Open loop: append ``rate`` events/s for ``duration`` s whatever the relays do, each
    stamped when it is sent; returns how many were offered.

    Due events are sent together when the loop wakes late, so a slow system under test
    shows up as latency, never as a lower offered rate.
    """
    total = round(rate * duration)
    begun = time.monotonic()
    sent = 0
    while sent < total:
        due = min(total, int((time.monotonic() - begun) * rate) + 1)
        if due > sent:
            now_ms = time.time() * 1000
            if due - sent == 1:
                await client.xadd(factory.stream(sent), factory.fields(sent, now_ms))
            else:
                pipe = client.pipeline(transaction=False)
                for n in range(sent, due):
                    pipe.xadd(factory.stream(n), factory.fields(n, now_ms))
                await pipe.execute()
            sent = due
        wake = begun + sent / rate
        await asyncio.sleep(max(0.0, wake - time.monotonic()))
    return sent


async def wait_arrivals(
    client: Redis, streams: Sequence[str], events: int, *, stall_timeout: float
) -> tuple[int, int]:
    """Poll the final streams' lengths until ``events`` arrived, or nothing arrived for
    ``stall_timeout`` s (a broken side must not hang the bench); returns the length and
    the number of ``XLEN`` polls (so command counts can leave them out)."""
    seen, last_change = -1, time.monotonic()
    polls = 0
    while True:
        count = sum([int(await client.xlen(stream)) for stream in streams])
        polls += len(streams)
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
    """What the final stream holds after a run."""

    latencies_ms: list[float] = field(default_factory=list)
    first_ms: float = 0.0
    last_ms: float = 0.0
    counts: dict[int, int] = field(default_factory=dict)

    def exactly_once(self, events: int) -> bool:
        """Every event ``0..events-1`` arrived, none twice, nothing else."""
        return len(self.counts) == events and all(
            self.counts.get(n) == 1 for n in range(events)
        )


async def read_arrivals(
    client: Redis, streams: Sequence[str], *, not_before_ms: float
) -> Arrivals:
    """Read the whole final streams; latency counts from the later of the publish stamp
    and ``not_before_ms`` (a pre-loaded backlog waits for the start, which is not the
    relay's latency)."""
    result = Arrivals()
    for stream in streams:
        await _read_final(client, stream, not_before_ms, result)
    return result


async def _read_final(
    client: Redis, stream: str, not_before_ms: float, result: Arrivals
) -> None:
    cursor = "-"
    while True:
        batch: Any = await client.xrange(stream, min=cursor, max="+", count=CHUNK)
        if not batch:
            break
        for entry_id, fields in batch:
            arrived = int(entry_id.split("-", 1)[0]) + 0.5
            data = _json.loads(fields["data"])
            n = int(data["n"])
            result.counts[n] = result.counts.get(n, 0) + 1
            result.latencies_ms.append(max(0.0, arrived - max(float(data["t"]), not_before_ms)))
            result.last_ms = max(result.last_ms, arrived)
            result.first_ms = min(result.first_ms or arrived, arrived)
        cursor = "(" + batch[-1][0]


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for no data)."""
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
