"""Load for a bench run: a backlog loaded before the start, or events offered at a rate.

Every event is a printery envelope (so printery and the same-entry ceiling read the same
entries), or for the minimal ceiling an entry of the one field ``data``, whose ``data``
carries its number ``n`` and its publish time ``t`` in the server's clock (ms); the
sinks note when it arrived (:mod:`printery.bench.arrivals`).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from printery.base import _json
from printery.bench.names import BenchLayout
from printery.store import Redis
from printery.wire.envelope import Codec

CODEC = Codec()

#: Entries per pipeline while loading a backlog.
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


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for no data)."""
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
