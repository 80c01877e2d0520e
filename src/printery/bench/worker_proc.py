"""One relay process of a bench run: ``python -m printery.bench.worker_proc KIND URL PREFIX``.

The driver (:mod:`printery.bench.procs`) talks to it over stdin and stdout, one line at a
time, so that no stage reads before the backlog is loaded and the driver can take CPU
readings at the exact start and end:

* the process prepares (connects, creates groups) and prints ``@bench ready {...}``, the
  JSON naming the settings it runs with (printery: its ``prefetch``);
* on ``go`` it starts relaying and prints ``@bench running``;
* on ``stop`` (or end of input) it stops, printing ``@bench done {"maxrss_kb": ...}``.

Anything else it writes (logs) goes to stderr, so the protocol lines stay parseable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

import psutil
import structlog

from printery.base import _json
from printery.base._util import settle_gc
from printery.base.worker import Observable
from printery.bench.arrivals import ArrivalRecorder
from printery.bench.ceiling import CeilingRelay
from printery.bench.load import server_offset_ms
from printery.bench.names import PROTOCOL_PREFIX, BenchLayout
from printery.bench.stages import FEATURES, bench_manager, bench_settings
from printery.observe import telemetry
from printery.transport.connection import connect, connect_bare

KINDS = ("ceiling", "ceiling_minimal", "printery")


def _say(line: str) -> None:
    sys.stdout.write(PROTOCOL_PREFIX + line + "\n")
    sys.stdout.flush()


class _PeakRss:
    """Samples this process's resident memory: ``ru_maxrss`` would not do, because Linux
    carries it over ``exec`` from the forked driver, whose own peak it may then report."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, int(self.process.memory_info().rss))

    async def run(self, interval: float = 0.05) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)


async def _next_command() -> str:
    line = await asyncio.to_thread(sys.stdin.readline)
    return line.strip() or "stop"


async def _serve_ceiling(
    kind: str, url: str, layout: BenchLayout, batch: int, block_ms: int
) -> None:
    client = connect_bare(url)
    try:
        recorder = ArrivalRecorder(client, layout, await server_offset_ms(client))
        relay = CeilingRelay(client, layout, recorder, batch=batch, block_ms=block_ms,
                             minimal=kind == "ceiling_minimal")
        await relay.prepare()
        _say("ready " + _json.dumps({"batch": batch, "block_ms": block_ms}))
        if await _next_command() != "go":
            return
        recorder.start()
        task = asyncio.create_task(relay.run())
        _say("running")
        await _next_command()
        relay.stopping.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, block_ms / 1000 + 5)
        await recorder.stop()
    finally:
        await client.aclose()


async def _serve_printery(
    url: str, layout: BenchLayout, prefetch: int | None, features: list[str]
) -> None:
    settings = bench_settings(prefetch)
    client = connect(url, block_ms=settings.block_ms)
    telemetry.start(None, os.environ)  # traced like the service when OTEL_* asks for it
    try:
        recorder = ArrivalRecorder(client, layout, await server_offset_ms(client))
        manager = bench_manager(client, layout, settings, recorder, features)
        for worker in manager.workers.values():
            if isinstance(worker, Observable):
                await worker.prepare()
        settle_gc()  # as printery-workers does once its workers are built
        _say("ready " + _json.dumps({"prefetch": settings.prefetch,
                                     "block_ms": settings.block_ms}))
        if await _next_command() != "go":
            return
        recorder.start()
        await manager.start_all()
        _say("running")
        await _next_command()
        await manager.stop_all(10.0)
        await recorder.stop()
    finally:
        await client.aclose()
        if telemetry.is_on():
            await asyncio.to_thread(telemetry.shutdown)


async def _serve(args: argparse.Namespace, layout: BenchLayout, rss: _PeakRss) -> None:
    sampler = asyncio.create_task(rss.run())
    try:
        if args.kind == "printery":
            await _serve_printery(args.url, layout, args.prefetch, args.features)
        else:
            await _serve_ceiling(args.kind, args.url, layout, args.batch, args.block_ms)
    finally:
        sampler.cancel()
        rss.sample()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="printery.bench.worker_proc")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100, help="the ceilings' read count")
    parser.add_argument("--block-ms", type=int, default=100, help="the ceilings' block time")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="printery's prefetch (default: the library's)")
    parser.add_argument("--with", dest="features", action="append", default=[],
                        choices=FEATURES, help="add this to every printery stage")
    args = parser.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    layout = BenchLayout(args.prefix, args.stages, args.partitions)
    rss = _PeakRss()
    asyncio.run(_serve(args, layout, rss))
    _say("done " + _json.dumps({"maxrss_kb": rss.peak // 1024}))


if __name__ == "__main__":
    main()
