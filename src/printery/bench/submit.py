"""``printery bench --submit``: how fast an application gets work in (docs/reference.md,
Runs).

Three ways to publish the same ``events`` complete ingress entries, in one run on one
server, each to a fresh prefix: raw ``XADD``s pipelined 100 at a time (the ceiling: no
validation, no idempotency), :meth:`Client.submit` with 100 calls in flight (validated,
idempotent, one script round trip each), and :class:`SyncClient` in a plain loop (one
call at a time, as synchronous code makes them). Each entry is a ``docs`` pipeline
submission of about ``payload_bytes``, so the figure is the client's own cost, not a
pipeline's validation rules.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from pydantic import BaseModel

from printery.bench.server import bench_server
from printery.pipeline.dag import Pipeline
from printery.runs.client import Client, SyncClient
from printery.runs.facade import Runs
from printery.runtime.handler import Message
from printery.transport.connection import connect
from printery.wire.envelope import DEFAULT_PAYLOAD_LIMIT
from printery.wire.keys import StreamKeys

__all__ = ["format_submit", "run_submit_bench"]

IN_FLIGHT = 100


class _Document(BaseModel):
    doc_id: str
    text: str


def bench_pipeline() -> Pipeline:
    """One ingress step with an input model: what a submit validates against."""
    pipeline = Pipeline("submit-bench", ingress=["doc:submitted"], correlation_field="doc_id",
                        id_prefix="doc")

    @pipeline.step("take", consumes=["doc:submitted"], input_model=_Document)
    async def take(message: Message) -> None:
        return None

    return pipeline


def _data(n: int, pad: str) -> dict[str, Any]:
    return {"doc_id": f"d{n}", "text": pad}


async def _raw(url: str, prefix: str, pipeline: Pipeline, events: int, pad: str) -> float:
    """Pipelined XADDs of the entries the client would write (built before the timing;
    no checks, no idempotency)."""
    redis = connect(url)
    runs = Runs(redis, StreamKeys(prefix), pipeline, payload_limit=DEFAULT_PAYLOAD_LIMIT)
    stream = runs.keys.stream("doc:submitted")
    entries = [runs.prepare(_data(n, pad))[3] for n in range(events)]
    began = time.perf_counter()
    try:
        for start in range(0, events, IN_FLIGHT):
            pipe = redis.pipeline(transaction=False)
            for fields in entries[start:start + IN_FLIGHT]:
                pipe.xadd(stream, fields)  # type: ignore[arg-type]
            await pipe.execute()
    finally:
        await redis.aclose()
    return time.perf_counter() - began


async def _async_client(client: Client, events: int, pad: str) -> float:
    """``IN_FLIGHT`` submitters, each awaiting one submit after another."""

    async def submitter(first: int) -> None:
        for n in range(first, events, IN_FLIGHT):
            await client.submit(_data(n, pad))

    began = time.perf_counter()
    await asyncio.gather(*(submitter(first) for first in range(IN_FLIGHT)))
    return time.perf_counter() - began


def _sync_client(url: str, prefix: str, pipeline: Pipeline, events: int, pad: str) -> float:
    with SyncClient(url, stream_prefix=prefix, app=pipeline) as client:
        client.submit(_data(-1, pad))  # connect and load the script outside the timing
        began = time.perf_counter()
        for n in range(events):
            client.submit(_data(n, pad))
        return time.perf_counter() - began


async def run_submit_bench(*, events: int, payload_bytes: int, redis_url: str | None) -> dict[str, Any]:
    """The three figures (events/s) and the async client's ratio to raw ``XADD``."""
    pipeline = bench_pipeline()
    pad = "x" * max(0, payload_bytes - 30)
    sync_events = max(1, events // 5)
    async with bench_server(redis_url) as server:
        url, tag = server.url, uuid.uuid4().hex[:8]
        raw_s = await _raw(url, f"bench:{tag}:raw", pipeline, events, pad)
        async with Client(url, stream_prefix=f"bench:{tag}:async", app=pipeline) as client:
            await client.submit(_data(-1, pad))  # load the script outside the timing
            async_s = await _async_client(client, events, pad)
        sync_s = await asyncio.to_thread(_sync_client, url, f"bench:{tag}:sync", pipeline,
                                         sync_events, pad)
    figures = {
        "raw_xadd": {"events": events, "events_per_s": round(events / raw_s, 1)},
        "client": {"events": events, "in_flight": IN_FLIGHT,
                   "events_per_s": round(events / async_s, 1)},
        "sync_client": {"events": sync_events, "events_per_s": round(sync_events / sync_s, 1)},
    }
    ratio = figures["client"]["events_per_s"] / figures["raw_xadd"]["events_per_s"]
    return {"mode": "submit", "payload_bytes": payload_bytes, **figures,
            "ratio": round(ratio, 3), "verified": True}


def format_submit(result: dict[str, Any]) -> str:
    rows = [("raw XADD, pipelined by 100", result["raw_xadd"]),
            (f"Client.submit, {result['client']['in_flight']} in flight", result["client"]),
            ("SyncClient.submit, one at a time", result["sync_client"])]
    lines = [f"printery bench --submit: {result['payload_bytes']} B payload", "",
             f"{'':36} {'events':>8} {'events/s':>10}"]
    lines += [f"{name:36} {figures['events']:>8,} {figures['events_per_s']:>10,.0f}"
              for name, figures in rows]
    lines += ["", f"ratio (Client.submit / raw XADD events/s): {result['ratio']:.2f}"]
    return "\n".join(lines)
