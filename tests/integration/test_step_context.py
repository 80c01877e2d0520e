"""What a step's own code gets of the worker that runs it (printery.runtime.step_context):
one StepContext, given to ``on_context`` as the worker is built and to each companion as
it runs, narrow (no worker, no loops), and enough to write outputs no entry caused."""

from __future__ import annotations

import asyncio
from dataclasses import fields

import redis.asyncio as aioredis

from printery import ConsumerSettings, Message, Output, Pipeline, Step
from printery.runtime.step_context import StepContext
from printery.wire.keys import StreamKeys
from support.spine import running_pipeline


async def test_a_companion_gets_the_steps_context_and_writes_through_it(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    bound: list[StepContext] = []
    given: list[StepContext] = []
    written: list[int] = []
    done = asyncio.Event()

    async def companion(context: StepContext) -> None:
        given.append(context)
        tick = Output("tick", {"n": 1}, correlation_id="run-1", once="tick:run-1")
        for _ in range(2):  # the second is refused by the once guard
            written.append(await context.emit([tick], correlation_id="run-1"))
        done.set()

    async def handle(message: Message) -> None:
        return None

    pipeline = Pipeline("ticks", ingress=["in"])
    pipeline.add(Step(name="ticker", consumes=("in",), produces=("tick",), handler=handle,
                      concurrency=2, companions=(companion,), on_context=bound.append))
    settings = ConsumerSettings(block_ms=100)
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings):
        await asyncio.wait_for(done.wait(), 10)

    (context,) = bound
    assert given == [context], "on_context and the companion get the same context"
    assert {f.name for f in fields(StepContext)} == {
        "name", "keys", "settings", "codec", "store", "index", "emit"}
    assert (context.name, context.keys.prefix, context.settings.concurrency) == (
        "ticker", prefix, 2)
    assert written == [1, 0]
    entries = await client.xrange(keys.stream("tick"))
    assert len(entries) == 1 and context.codec.decode(entries[0][1], "tick").data == {"n": 1}
