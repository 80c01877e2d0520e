"""Spans of a validation loop and of its model calls (docs/reference.md, Validation loops;
Tracing): each turn of a loop is a span whose ``printery.attempt`` is the loop's attempt
it runs or judges, and each ``OpenAICompatible.complete`` is a ``model.complete`` span, a
child of its turn's, naming the model and the tokens. Tracing is on in this process,
exporting to a local OTLP/HTTP receiver; the model is a local OpenAI-compatible HTTP
server; the server and workers are real."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import Loop, Message, Pipeline, Reason, StreamKeys
from printery.observe import telemetry
from printery.pipeline.models import OpenAICompatible
from printery.runtime.consumer import ConsumerSettings
from printery.testing import wait_for
from support.otlp import OtlpReceiver, otlp_receiver
from support.spine import publish, running


@pytest.fixture
def traced() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as receiver:
        assert telemetry.start(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        try:
            yield receiver
        finally:
            telemetry.shutdown()


@pytest.fixture
async def model_url() -> AsyncIterator[str]:
    """A chat-completions server answering ``draft <n>`` for the n-th call, 5 + 7 tokens;
    the third call is refused with a 400."""
    calls = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        body = await request.json()
        if calls == 3:
            return web.Response(status=400, text="bad request")
        return web.json_response({
            "model": body["model"],
            "choices": [{"message": {"role": "assistant", "content": f"draft {calls}"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}/v1"
    await runner.cleanup()


def loop_pipeline(llm: OpenAICompatible) -> Pipeline:
    pipeline = Pipeline("answers", ingress=["in"], cost_units=["tokens"])

    async def work(message: Message) -> dict[str, Any]:
        done = await llm.complete(message, messages=[{"role": "user", "content": "go"}])
        return {"text": done.text}

    def validate(message: Message) -> list[Reason]:
        if message.data["text"] == "draft 2":
            return []
        return [Reason("not_yet", "text", "only the second draft passes")]

    pipeline.add(Loop("draft", consumes="in", produces="out", work=work, validate=validate,
                      exhausted="out:exhausted", max_attempts=3, cost_units=["tokens"]))
    return pipeline


async def test_loop_turns_carry_their_attempt_and_model_calls_are_child_spans(
    client: aioredis.Redis, prefix: str, traced: OtlpReceiver, model_url: str
) -> None:
    keys = StreamKeys(prefix)
    llm = OpenAICompatible(model_url, "tiny-1", api_key_env=None)
    pipeline = loop_pipeline(llm)
    settings = ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                                claim_interval=0.1)
    workers = [w for w, _ in pipeline.build_workers(client=client, keys=keys, settings=settings)]
    async with running(*workers):
        await publish(client, keys, "in", 1)

        async def answered() -> list[Any]:
            return list(await client.xrange(keys.stream("out")))

        await wait_for(answered, timeout=20, message="the loop's answer")
    telemetry.shutdown()  # exports every span now
    # Turns: the input (runs attempt 1), attempt 1 (judged), its verdict (runs attempt
    # 2), attempt 2 (judged: passed), its verdict (decided already); two model calls.
    spans = traced.wait_for(7)
    turns = sorted((s for s in spans if s.name == "draft"),
                   key=lambda s: s.attributes["printery.attempt"])
    assert [s.attributes["printery.attempt"] for s in turns] == [1, 1, 2, 2, 2]
    calls = [s for s in spans if s.name == "model.complete"]
    assert len(calls) == 2
    by_id = {s.span_id: s for s in turns}
    parents = sorted(by_id[call.parent_span_id].attributes["printery.attempt"] for call in calls)
    assert parents == [1, 2], "each call is a child of the turn that ran its attempt"
    for call in calls:
        assert call.trace_id == by_id[call.parent_span_id].trace_id
        assert call.attributes["printery.model"] == "tiny-1"
        assert call.attributes["printery.tokens"] == 12
        assert call.attributes["gen_ai.usage.input_tokens"] == 5
        assert call.attributes["http.response.status_code"] == 200
        assert call.kind == 3  # SPAN_KIND_CLIENT
        assert call.status_code != 2  # not STATUS_CODE_ERROR


async def test_a_refused_model_call_is_a_failed_span(
    client: aioredis.Redis, prefix: str, traced: OtlpReceiver, model_url: str
) -> None:
    """The third call is refused (400): its span says so, with the status code."""
    llm = OpenAICompatible(model_url, "tiny-1", api_key_env=None)
    keys = StreamKeys(prefix)
    pipeline = Pipeline("one", ingress=["in"], cost_units=["tokens"])

    @pipeline.step("ask", consumes=["in"], produces=["out"], cost_units=["tokens"],
                   max_deliveries=1)
    async def ask(message: Message) -> None:
        await llm.complete(message, messages=[{"role": "user", "content": "go"}])

    settings = ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                                claim_interval=0.1)
    workers = [w for w, _ in pipeline.build_workers(client=client, keys=keys, settings=settings)]
    async with running(*workers):
        await publish(client, keys, "in", 3)

        async def settled() -> bool:
            return await client.xlen(keys.dlq) == 1

        await wait_for(settled, timeout=20, message="the refused call's dead letter")
    telemetry.shutdown()
    spans = traced.wait_for(6)
    calls = [s for s in spans if s.name == "model.complete"]
    assert sorted(s.attributes["http.response.status_code"] for s in calls) == [200, 200, 400]
    (refused,) = [s for s in calls if s.attributes["http.response.status_code"] == 400]
    assert refused.status_code == 2  # STATUS_CODE_ERROR
    assert "printery.tokens" not in refused.attributes
