"""The trace of a run goes on through what printery writes outside a step's own outputs
(docs/reference.md, Tracing): an escalation's review and what its approval writes, and a
replay's copies, carry the trace context. Tracing is turned on in this process, exporting
to a local OTLP/HTTP receiver the test decodes."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from printery import (
    REVIEW,
    Message,
    Output,
    Pipeline,
    Step,
    StreamKeys,
    WorkerManager,
    escalate,
)
from printery.inbox import reviews
from printery.observe import telemetry
from printery.runs.replay import replay
from printery.testing import wait_for
from support.otlp import OtlpReceiver, otlp_receiver


async def failing(message: Message) -> Output:
    raise RuntimeError("model unavailable")


def escalating_pipeline() -> Pipeline:
    p = Pipeline("rev", ingress=["task"])
    p.add(Step("work", ("task",), ("answer", "failed", REVIEW),
               escalate(failing, attempts=1, review_kind="model_failed",
                        on_approve="answer", on_reject="failed")))
    return p


@pytest.fixture
def traced() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as receiver:
        assert telemetry.start(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        try:
            yield receiver
        finally:
            telemetry.shutdown()


async def test_review_and_replay_keep_the_trace(
    client: aioredis.Redis, prefix: str, traced: OtlpReceiver
) -> None:
    keys, p = StreamKeys(prefix), escalating_pipeline()
    trace_id, producer_span = secrets.token_hex(16), secrets.token_hex(8)
    given = f"00-{trace_id}-{producer_span}-01"
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in p.build_workers(client=client, keys=keys, only=["work"]):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        await client.xadd(keys.stream("task"), {"data": json.dumps({"correlation_id": "c1"}),
                                                "traceparent": given})

        async def escalated() -> list[tuple[str, dict[str, str]]]:
            return list(await client.xrange(keys.review))

        ((review_id, review),) = await wait_for(escalated, timeout=10)
    finally:
        await manager.stop_all(2)
    # The review was written by the step's span, in the producer's trace.
    _, review_trace, work_span, _ = review["traceparent"].split("-")
    assert review_trace == trace_id and work_span != producer_span

    await reviews.approve(client, keys, p, review_id, by="ana")
    ((_, answer),) = await client.xrange(keys.stream("answer"))
    assert answer["traceparent"] == review["traceparent"]

    result = await replay(client, keys, p, "c1")
    ((_, copy),) = await client.xrange(keys.stream("task"), min=result.entries[0]["id"])
    assert copy["traceparent"] == given and copy["replay_of"] == "c1"

    telemetry.shutdown()  # exports the step's span now
    (span,) = traced.wait_for(1)
    assert (span.name, span.trace_id, span.span_id) == ("work", trace_id, work_span)
    assert span.parent_span_id == producer_span
    assert span.attributes["printery.run_id"] == "c1"
