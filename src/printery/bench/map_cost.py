"""``printery bench --map N``: what a :class:`~printery.Map` costs per item (reference:
fan-out), against the same items as plain entries, in one run on one server.

Two sides, each on a fresh prefix, its workers in this process with the library's
default settings, the same trivial handler for every item:

* ``map``: one run whose split writes ``N`` items (``{"n", "text"}`` of about
  ``payload_bytes``), each handled by the Map's each step, the results counted by its
  collector, which writes the output once in item order; timed from the submit until
  the output is there.
* ``plain``: the same ``N`` items written as plain entries (pipelined ``XADD``), each
  handled by a step with the same handler, its output consumed by a second step that
  does nothing: the same two hops per item a Map's item makes (each, collect), without
  the Map's fan-out fields, its count per run or its ordered output; timed from the
  first ``XADD`` until the second step has acknowledged every entry.

``ratio`` is map items/s over plain items/s; with ``rounds`` above 1 the sides alternate
(no side always first) and the ratio is the median of the rounds'. Either way every
side is checked: the Map's output must hold every item once, in order, and the plain
side must have handled every entry.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

from printery.base import _json
from printery.bench.cleanup import delete_prefix
from printery.bench.server import bench_server
from printery.pipeline.dag import Pipeline
from printery.pipeline.fanout import Map
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Message, Output
from printery.runtime.payloads import PayloadStore
from printery.store import Redis
from printery.supervisor.manager import WorkerManager
from printery.transport.connection import connect
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

__all__ = ["format_map", "run_map_bench"]

#: Longest one side may take before it is reported as not finished.
SIDE_TIMEOUT = 300.0
#: How often a side's end is looked for (a bounded poll of two counters).
POLL_S = 0.005


async def _handle(message: Message) -> dict[str, Any]:
    data = message.data
    return {"n": data["n"], "length": len(data["text"])}


def map_pipeline(max_items: int) -> Pipeline:
    pipeline = Pipeline("bench-map", ingress=["doc"])
    pipeline.add(Map("pages", consumes="doc", produces="merged", max_items=max_items,
                     split=lambda message: [{"n": n, "text": message.data["pad"]}
                                            for n in range(message.data["count"])],
                     each=_handle))
    return pipeline


def plain_pipeline() -> Pipeline:
    pipeline = Pipeline("bench-plain", ingress=["item"])
    pipeline.step("each", consumes=["item"], produces=["result"])(_each_output)
    pipeline.step("collect", consumes=["result"])(_nothing)
    return pipeline


async def _each_output(message: Message) -> Output:
    return Output("result", await _handle(message))


async def _nothing(message: Message) -> None:
    return None


async def _running(pipeline: Pipeline, client: Redis, prefix: str) -> WorkerManager:
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in pipeline.build_workers(client=client, keys=StreamKeys(prefix),
                                               settings=ConsumerSettings()):
        manager.register(worker, deps)
    await manager.start_all()
    return manager


async def _until(done: Callable[[], Awaitable[bool]], began: float) -> float:
    """Seconds from ``began`` until ``done()``; raises TimeoutError past the side's limit."""
    while not await done():
        if time.perf_counter() - began > SIDE_TIMEOUT:
            raise TimeoutError(f"not finished within {SIDE_TIMEOUT:g} s")
        await asyncio.sleep(POLL_S)
    return time.perf_counter() - began


async def _map_side(client: Redis, prefix: str, items: int, pad: str) -> dict[str, Any]:
    pipeline = map_pipeline(items)
    keys = StreamKeys(prefix)
    manager = await _running(pipeline, client, prefix)
    try:
        codec = pipeline.codec()
        entry = codec.encode(codec.new("doc", {"count": items, "pad": pad},
                                       correlation_id="bench-run", producer="bench"))
        merged = keys.stream("merged")
        began = time.perf_counter()
        await client.xadd(keys.stream("doc"), entry)  # type: ignore[arg-type]

        async def written() -> bool:
            return bool(await client.xlen(merged))

        seconds = await _until(written, began)
        ((_, fields),) = await client.xrange(merged)
        fields = await PayloadStore(client, keys).resolve_fields(fields)  # a large output's blob
        outputs = _json.loads(fields["data"])["items"]
        verified = [o["n"] for o in outputs] == list(range(items))
    finally:
        await manager.stop_all(5)
    return {"items": items, "seconds": round(seconds, 3),
            "items_per_s": round(items / seconds, 1), "verified": verified}


async def _plain_side(client: Redis, prefix: str, items: int, pad: str) -> dict[str, Any]:
    pipeline = plain_pipeline()
    keys = StreamKeys(prefix)
    manager = await _running(pipeline, client, prefix)
    try:
        codec: Codec = pipeline.codec()
        entries = [codec.encode(codec.new("item", {"n": n, "text": pad},
                                          correlation_id=f"bench-{n}", producer="bench"))
                   for n in range(items)]
        results = keys.stream("result")
        began = time.perf_counter()
        for start in range(0, items, 256):
            pipe = client.pipeline(transaction=False)
            for fields in entries[start:start + 256]:
                pipe.xadd(keys.stream("item"), fields)  # type: ignore[arg-type]
            await pipe.execute()

        async def handled() -> bool:
            if await client.xlen(results) < items:
                return False
            groups = await cast(Awaitable[list[dict[str, Any]]], client.xinfo_groups(results))
            return any(g["name"] == "collect" and g["pending"] == 0 and g["lag"] == 0
                       for g in groups)

        seconds = await _until(handled, began)
        verified = await client.xlen(results) == items
    finally:
        await manager.stop_all(5)
    return {"items": items, "seconds": round(seconds, 3),
            "items_per_s": round(items / seconds, 1), "verified": verified}


async def run_map_bench(*, items: int, payload_bytes: int, redis_url: str | None,
                        rounds: int = 1) -> dict[str, Any]:
    """Both sides ``rounds`` times: each side's figures (of its median round) and the
    ratio of map to plain items/s (the median of the rounds')."""
    pad = "x" * max(0, payload_bytes - 20)
    per_round: list[dict[str, Any]] = []
    async with bench_server(redis_url) as server:
        client = connect(server.url, block_ms=100)
        try:
            for turn in range(rounds):
                tag = uuid.uuid4().hex[:8]
                sides = ("map", "plain") if turn % 2 == 0 else ("plain", "map")
                measured: dict[str, Any] = {}
                for side in sides:
                    prefix = f"bench:{tag}:{side}"
                    run = _map_side if side == "map" else _plain_side
                    measured[side] = await run(client, prefix, items, pad)
                    await delete_prefix(client, prefix)
                measured["ratio"] = round(
                    measured["map"]["items_per_s"] / measured["plain"]["items_per_s"], 3)
                per_round.append(measured)
        finally:
            await client.aclose()
    ratio = statistics.median(r["ratio"] for r in per_round)

    def median_of(side: str) -> dict[str, Any]:
        ordered = sorted(per_round, key=lambda r: r[side]["items_per_s"])
        return dict(ordered[len(ordered) // 2][side])

    return {"mode": "map", "items": items, "payload_bytes": payload_bytes, "rounds": rounds,
            "map": median_of("map"), "plain": median_of("plain"), "ratio": round(ratio, 3),
            "per_round": [r["ratio"] for r in per_round],
            "verified": all(r[s]["verified"] for r in per_round for s in ("map", "plain"))}


def format_map(result: dict[str, Any]) -> str:
    lines = [f"printery bench --map {result['items']}: {result['payload_bytes']} B items, "
             f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''}", "",
             f"{'':46} {'items':>7} {'seconds':>8} {'items/s':>9}"]
    for name, side in (("Map (split, each, collect: output in order)", result["map"]),
                       ("plain entries (each, then a second step)", result["plain"])):
        lines.append(f"{name:46} {side['items']:>7,} {side['seconds']:>8.3f} "
                     f"{side['items_per_s']:>9,.0f}")
    lines += ["", f"ratio (map / plain items/s): {result['ratio']:.2f}"
              + (f"  (rounds: {', '.join(f'{r:.2f}' for r in result['per_round'])})"
                 if result["rounds"] > 1 else ""),
              f"verified: {str(result['verified']).lower()}"]
    return "\n".join(lines)
