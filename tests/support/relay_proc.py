"""A relay service in its own OS process, for multi-process tests.

Usage: python -m support.relay_proc URL PREFIX [--delay S] [--visibility S] [--prefetch N]
Prints "ready" once its worker reads; stops gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import structlog

from printery.keys import StreamKeys
from printery.runtime.handler import Message, Output
from printery.runtime.stream_worker import ConsumerSettings, StreamWorker
from printery.supervisor.manager import WorkerManager
from printery.transport.connection import connect


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--visibility", type=float, default=2.0)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=0)
    parser.add_argument("--drain", type=float, default=10.0)
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    client = connect(args.url, block_ms=100)
    pid = str(os.getpid())

    async def handler(msg: Message) -> Output:
        if args.delay:
            await asyncio.sleep(args.delay)
        return Output("out", msg.data, extra={"by": pid})

    worker = StreamWorker(
        "w", client=client, keys=StreamKeys(args.prefix), consumes=["in"], handler=handler,
        settings=ConsumerSettings(
            block_ms=100, visibility_timeout=args.visibility, prefetch=args.prefetch,
            parallel=args.parallel or None, claim_interval=0.1,
        ),
    )
    manager = WorkerManager(drain_timeout=args.drain)
    manager.register(worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await manager.start_all()
    print("ready", flush=True)
    await stop.wait()
    await manager.stop_all()
    await client.aclose()
    print("stopped", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    asyncio.run(main())
