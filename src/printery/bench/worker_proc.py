"""One relay process of a bench run: ``python -m printery.bench.worker_proc KIND URL PREFIX``.

The driver (:mod:`printery.bench.procs`) talks to it over stdin and stdout, one line at a
time, so that no stage reads before the backlog is loaded and the driver can take CPU
readings at the exact start and end:

* the process prepares (connects, creates groups) and prints ``@bench ready``;
* on ``go`` it starts relaying and prints ``@bench running``;
* on ``stop`` (or end of input) it stops, printing ``@bench done {"maxrss_kb": ...}``.

Anything else it writes (logs) goes to stderr, so the protocol lines stay parseable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

import psutil
import structlog

from printery import _json
from printery.bench.ceiling import CeilingRelay
from printery.bench.layout import PROTOCOL_PREFIX, BenchLayout
from printery.bench.stages import bench_manager
from printery.transport.connection import connect
from printery.worker import Observable


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


async def _serve(
    kind: str, url: str, layout: BenchLayout, batch: int, block_ms: int, rss: _PeakRss
) -> None:
    client = connect(url, block_ms=block_ms)
    sampler = asyncio.create_task(rss.run())
    try:
        if kind == "ceiling":
            relay = CeilingRelay(client, layout, batch=batch, block_ms=block_ms)
            await relay.prepare()
            _say("ready")
            if await _next_command() != "go":
                return
            task = asyncio.create_task(relay.run())
            _say("running")
            await _next_command()
            relay.stopping.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, block_ms / 1000 + 5)
        else:
            manager = bench_manager(client, layout, batch=batch, block_ms=block_ms)
            for worker in manager.workers.values():
                if isinstance(worker, Observable):
                    await worker.prepare()
            _say("ready")
            if await _next_command() != "go":
                return
            await manager.start_all()
            _say("running")
            await _next_command()
            await manager.stop_all(10.0)
    finally:
        sampler.cancel()
        rss.sample()
        await client.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="printery.bench.worker_proc")
    parser.add_argument("kind", choices=["ceiling", "printery"])
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--block-ms", type=int, default=100)
    args = parser.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    layout = BenchLayout(args.prefix, args.stages)
    rss = _PeakRss()
    asyncio.run(_serve(args.kind, args.url, layout, args.batch, args.block_ms, rss))
    _say("done " + _json.dumps({"maxrss_kb": rss.peak // 1024}))


if __name__ == "__main__":
    main()
