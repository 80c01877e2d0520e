"""Small workers and helpers the spine tests share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis

from printery import Client, ConsumerSettings, StreamWorker
from printery.base.worker import RunContext
from printery.runtime.handler import Handler, Message, Output
from printery.supervisor.manager import WorkerManager
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

CODEC = Codec()


async def publish(
    client: aioredis.Redis, keys: StreamKeys, event_type: str, n: int, start: int = 0, *,
    transaction: bool = False,
) -> None:
    """``n`` entries of ``event_type`` in one round trip (``transaction``: atomically, so
    a reader waiting on the stream gets them all in one read)."""
    pipe = client.pipeline(transaction=transaction)
    for i in range(start, start + n):
        envelope = CODEC.new(event_type, {"n": i}, correlation_id=f"c-{i}", producer="test")
        pipe.xadd(keys.stream(event_type), CODEC.encode(envelope))
    await pipe.execute()


def relay(target: str) -> Handler:
    async def handle(msg: Message) -> Output:
        return Output(target, msg.data)

    return handle


def stream_worker(
    name: str,
    client: aioredis.Redis,
    keys: StreamKeys,
    consumes: list[str],
    handler: Handler,
    **settings: object,
) -> StreamWorker:
    defaults: dict[str, object] = {"block_ms": 100, "visibility_timeout": 5.0, "retry_backoff_ms": 20}
    defaults.update(settings)
    return StreamWorker(
        name, client=client, keys=keys, consumes=consumes, handler=handler,
        settings=ConsumerSettings(**defaults),  # type: ignore[arg-type]
    )


async def outputs_by_n(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for _id, fields in await client.xrange(keys.stream(event_type)):
        n = int(CODEC.decode(fields, event_type).data["n"])
        counts[n] = counts.get(n, 0) + 1
    return counts


class PlainWorker:
    """A non-stream worker whose readiness and behaviour the test controls."""

    def __init__(self, name: str, *, ready_after: Callable[[], Awaitable[None]] | None = None,
                 crash: bool = False) -> None:
        self._name = name
        self.ready_after = ready_after
        self.crash = crash
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.runs = 0

    @property
    def name(self) -> str:
        return self._name

    def healthy(self) -> bool:
        return True

    async def run(self, ctx: RunContext) -> None:
        loop = asyncio.get_running_loop()
        self.runs += 1
        self.started_at = loop.time()
        if self.ready_after:
            await self.ready_after()
        self.ready_at = loop.time()
        ctx.started()
        if self.crash:
            raise RuntimeError(f"{self._name} crashes on purpose")
        await ctx.stopping.wait()


@asynccontextmanager
async def running(*workers: object) -> AsyncIterator[WorkerManager]:
    """The workers started under one manager, stopped (2 s drain) when the block ends."""
    manager = WorkerManager()
    for worker in workers:
        manager.register(worker)  # type: ignore[arg-type]
    await manager.start_all()
    try:
        yield manager
    finally:
        await manager.stop_all(2)


@asynccontextmanager
async def running_pipeline(pipeline: Any, **build: Any) -> AsyncIterator[WorkerManager]:
    """``pipeline``'s workers (``build``: the arguments of ``Pipeline.build_workers``)
    started under one manager with their dependencies, stopped (2 s drain) at the end."""
    manager = WorkerManager()
    for worker, deps in pipeline.build_workers(**build):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        yield manager
    finally:
        await manager.stop_all(2)


class Counting:
    """A handler relaying to ``out`` that counts its calls, sleeping ``delay`` s in each."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    async def __call__(self, msg: Message) -> Output:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return Output("out", msg.data)


@asynccontextmanager
async def pipeline_starter(
    url: str, client: Any, prefix: str, *, max_deliveries: int
) -> AsyncIterator[Callable[[Any], Awaitable[Client]]]:
    """A ``start(pipeline)`` that runs the pipeline's workers in this process (quick
    retries, short blocking reads) and returns a connected :class:`Client` submitting to
    it; everything started is stopped at the end (the fixture of the pipeline tests)."""
    managers: list[WorkerManager] = []
    clients: list[Client] = []

    async def start(pipeline: Any) -> Client:
        manager = WorkerManager(drain_timeout=2)
        settings = ConsumerSettings(block_ms=100, retry_backoff_ms=10,
                                    max_deliveries=max_deliveries)
        for worker, deps in pipeline.build_workers(client=client, keys=StreamKeys(prefix),
                                                   settings=settings):
            manager.register(worker, deps)
        await manager.start_all()
        managers.append(manager)
        submitter = Client(url, stream_prefix=prefix, app=pipeline)
        clients.append(await submitter.connect())
        return submitter

    try:
        yield start
    finally:
        for manager in managers:
            await manager.stop_all(2)
        for submitter in clients:
            await submitter.aclose()
