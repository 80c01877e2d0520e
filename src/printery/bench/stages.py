"""printery's side of the bench: ``stages`` no-op steps built with the public API only
(:class:`~printery.Pipeline`, :class:`~printery.ConsumerSettings`,
:class:`~printery.WorkerManager`), so the bench measures what a user's pipeline gets."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from printery import (
    ConsumerSettings,
    Handler,
    Limit,
    Message,
    Output,
    Pipeline,
    Step,
    WorkerManager,
)
from printery.bench.layout import BenchLayout


def _forward(target: str) -> Handler:
    async def handle(message: Message) -> Output:
        return Output(target, message.data)

    return handle


#: What ``--with`` can add to every stage.
FEATURES = ("limit",)


def bench_limits(stage: int) -> list[Limit]:
    """A stage's limit under ``--with limit``: a concurrency slot and a start in the
    window for every handler call (both the admission and the release path), at numbers
    a bench never reaches, so what is measured is the machinery and not the waiting."""
    return [Limit(f"bench-stage-{stage}", concurrency=1_000_000,
                  requests_per_minute=1_000_000_000)]


def bench_pipeline(layout: BenchLayout, features: Sequence[str] = ()) -> Pipeline:
    """A chain ``s0 -> stage0 -> s1 -> ... -> s<stages>`` of handlers that pass data on,
    each stage with the ``features`` asked for (:data:`FEATURES`)."""
    pipeline = Pipeline("bench", ingress=[layout.event_type(0)])
    for stage in range(layout.stages):
        target = layout.event_type(stage + 1)
        pipeline.add(
            Step(
                name=layout.group(stage), consumes=(layout.event_type(stage),),
                produces=(target,), handler=_forward(target),
                limits=bench_limits(stage) if "limit" in features else (),
            )
        )
    return pipeline


def bench_settings(prefetch: int | None) -> ConsumerSettings:
    """The library's defaults (what ``printery-workers`` runs with), or those with
    ``prefetch`` changed: the bench measures what a user gets unless told otherwise."""
    return ConsumerSettings() if prefetch is None else ConsumerSettings(prefetch=prefetch)


def bench_manager(
    client: aioredis.Redis, layout: BenchLayout, settings: ConsumerSettings,
    features: Sequence[str] = (),
) -> WorkerManager:
    """The stage workers, registered with their dependencies, not yet started."""
    manager = WorkerManager(drain_timeout=10.0)
    for worker, deps in bench_pipeline(layout, features).build_workers(
        client=client, keys=layout.keys, settings=settings
    ):
        manager.register(worker, deps)
    return manager
