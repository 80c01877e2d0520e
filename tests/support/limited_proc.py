"""A limited step in its own OS process, for the flow-control tests (docs/reference.md,
Flow control).

Usage: python -m support.limited_proc REDIS_URL PREFIX API_URL [--consumers N]
       [--concurrency N] [--rpm N] [--tpm N] [--tokens N] [--visibility S] [--window S]

Each handler call GETs ``API_URL?n=<n>`` (a real HTTP server the test runs, which counts
the requests in flight), reports ``--tokens`` tokens, and relays ``data`` to ``out``.
The step is limited by ``Limit("api", ...)``; "ready" is printed once the worker reads,
and it stops gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import httpx
import structlog

from printery import ConsumerSettings, Limit, StreamWorker
from printery.runtime.handler import Message, Output
from printery.supervisor.manager import WorkerManager
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("api")
    parser.add_argument("--consumers", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--rpm", type=int, default=None)
    parser.add_argument("--tpm", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=0)
    parser.add_argument("--visibility", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    client = connect(args.url, block_ms=100)
    http = httpx.AsyncClient(timeout=30)

    async def handler(msg: Message) -> Output:
        response = await http.get(args.api, params={"n": msg.data["n"]})
        response.raise_for_status()
        if args.tokens:
            msg.report_cost("tokens", args.tokens)
        return Output("out", msg.data)

    limit = Limit("api", concurrency=args.concurrency, requests_per_minute=args.rpm,
                  tokens_per_minute=args.tpm)
    worker = StreamWorker(
        "w", client=client, keys=StreamKeys(args.prefix), consumes=["in"], handler=handler,
        settings=ConsumerSettings(
            concurrency=args.consumers, block_ms=100, visibility_timeout=args.visibility,
            claim_interval=0.1, retry_backoff_ms=20, limit_window=args.window,
        ),
        limits=[limit],
    )
    manager = WorkerManager(drain_timeout=2.0)
    manager.register(worker)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await manager.start_all()
    print("ready", flush=True)
    await stop.wait()
    await manager.stop_all()
    await http.aclose()
    await client.aclose()
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
