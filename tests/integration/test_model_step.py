"""Model steps (docs/reference.md, Flow control and model steps):
``printery.pipeline.models.OpenAICompatible`` against a local OpenAI-compatible HTTP server the
test runs (the external boundary); the pipeline, server and workers are real."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import Budget, Limit, Message, Output, Pipeline
from printery.base.worker import WorkerState
from printery.observe.logging import configure_logging
from printery.pipeline.models import OpenAICompatible
from printery.runtime.consumer import ConsumerSettings
from printery.testing import wait_for
from printery.transport.commit import SPENT_SCALE
from printery.wire.keys import StreamKeys
from support.spine import CODEC, publish, running

KEY = "sk-test-5f1d0c9a7b3e4d2f8a6c"
PRICES = {"input": 0.5, "output": 1.5}


@dataclass
class Reply:
    status: int = 200
    prompt: int = 12
    completion: int = 30
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    sleep: float = 0.0
    #: A 200's whole JSON body instead of the usual completion (``usage`` and all).
    payload: dict[str, Any] | None = None


class FakeModel:
    """An OpenAI-compatible chat-completions server: answers the scripted replies in
    order (then the default one) and records every request."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.default = Reply()
        self.requests: list[tuple[float, dict[str, Any], str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((time.monotonic(), body, request.headers.get("Authorization", "")))
        reply = self.script.pop(0) if self.script else self.default
        if reply.sleep:
            await asyncio.sleep(reply.sleep)
        if reply.status != 200:
            return web.Response(status=reply.status, headers=reply.headers,
                                text=reply.body or f"status {reply.status}")
        if reply.payload is not None:
            return web.json_response(reply.payload)
        return web.json_response({
            "id": "cmpl-1", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": f"echo {body['messages'][-1]['content']}"}}],
            "usage": {"prompt_tokens": reply.prompt, "completion_tokens": reply.completion,
                      "total_tokens": reply.prompt + reply.completion},
        })


@pytest.fixture
async def model(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeModel]:
    monkeypatch.setenv("TEST_MODEL_KEY", KEY)
    fake = FakeModel()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.url = f"http://{host}:{port}/v1"
    yield fake
    await runner.cleanup()


def model_pipeline(llm: OpenAICompatible, seen: list[int], **step: Any) -> Pipeline:
    pipeline = Pipeline("m", ingress=["in"], cost_units=["tokens", "usd"])

    @pipeline.step("draft", consumes=["in"], produces=["out"], cost_units=["tokens", "usd"],
                   **step)
    async def draft(message: Message) -> Output:
        seen.append(message.deliveries)
        done = await llm.complete(message, messages=[{"role": "user", "content": str(message.data["n"])}],
                                  temperature=0)
        return Output("out", {"n": message.data["n"], "text": done.text, "tokens": done.tokens})

    return pipeline


def settings() -> ConsumerSettings:
    return ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                            claim_interval=0.1)


async def entries(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(keys.stream(event_type))]


async def run_until(client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline, n: int,
                    event_type: str = "out", timeout: float = 20.0) -> list[dict[str, str]]:
    workers = [w for w, _ in pipeline.build_workers(client=client, keys=keys, settings=settings())]
    async with running(*workers):
        await publish(client, keys, "in", n)

        async def written() -> list[dict[str, str]]:
            found = await entries(client, keys, event_type)
            return found if len(found) >= n else []

        return await wait_for(written, timeout=timeout, message=f"{n} {event_type}")


async def test_usage_is_the_steps_exact_tokens_and_usd(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    keys = StreamKeys(prefix)
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY", prices=PRICES)
    seen: list[int] = []
    (out,) = await run_until(client, keys, model_pipeline(llm, seen), 1)
    assert orjson.loads(out["cost"]) == {"tokens": 42, "usd": (12 * 0.5 + 30 * 1.5) / 1000}
    assert CODEC.decode(out, "out").data == {"n": 0, "text": "echo 0", "tokens": 42}
    (_, body, auth), = model.requests
    assert body == {"model": "tiny-1", "temperature": 0,
                    "messages": [{"role": "user", "content": "0"}]}
    assert auth == f"Bearer {KEY}"


async def test_a_429_is_retried_after_its_retry_after(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    keys = StreamKeys(prefix)
    model.script = [Reply(status=429, headers={"Retry-After": "1"})]
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY", prices=PRICES)
    seen: list[int] = []
    (out,) = await run_until(client, keys, model_pipeline(llm, seen), 1)
    (first, _, _), (second, _, _) = model.requests
    assert second - first >= 1.0, "asked again only once Retry-After had passed"
    assert seen == [1], "retried within the call: no second delivery"
    assert orjson.loads(out["cost"])["tokens"] == 42


async def test_a_timeout_is_a_retryable_failure(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    keys = StreamKeys(prefix)
    model.script = [Reply(sleep=3.0)]
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY", timeout=0.3)
    seen: list[int] = []
    (out,) = await run_until(client, keys, model_pipeline(llm, seen), 1)
    assert seen == [1, 2], "the timed-out call failed the delivery; the next one succeeded"
    assert orjson.loads(out["cost"]) == {"tokens": 42}


async def test_the_key_appears_in_no_log_and_no_error(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    """A server that echoes the key in its refusal (some do): the failure is logged and
    dead-lettered with the status, never with the key."""
    keys = StreamKeys(prefix)
    model.default = Reply(status=401, body=f'{{"error": "Incorrect API key provided: {KEY}"}}')
    log = io.StringIO()
    configure_logging("debug", json=True, stream=log)
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY")
    seen: list[int] = []
    pipeline = model_pipeline(llm, seen, max_deliveries=2)
    (dead,) = await run_until(client, keys, pipeline, 1, event_type="dlq")
    assert "401" in dead["error"] and KEY not in orjson.dumps(dead).decode()
    text = log.getvalue()
    assert "handler failed" in text and "401" in text
    assert KEY not in text


async def test_tokens_per_minute_charged_by_real_usage(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    """42 tokens a call, 60 per window (shortened to 2 s for the test), one call at a
    time: the second call starts (42 < 60), the third waits until the first call's
    tokens leave the window."""
    keys = StreamKeys(prefix)
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY")
    seen: list[int] = []
    pipeline = model_pipeline(llm, seen, limits=[
        Limit("llm", tokens_per_minute=60, concurrency=1)])
    workers = [w for w, _ in pipeline.build_workers(client=client, keys=keys, settings=replace(
        settings(), limit_window=2.0))]
    async with running(*workers) as manager:
        await publish(client, keys, "in", 3)

        async def third_waits() -> bool:
            status = manager.get_status()["draft"]
            return (status["state"] == WorkerState.RUNNING and len(model.requests) == 2
                    and status["limits"]["llm"]["waiting"] == 1)

        await wait_for(third_waits, timeout=10, message="the third call waiting")
        charged = await client.hvals(keys.limit("llm") + ":tokens")  # per time bucket
        assert sum(float(value) for value in charged) == 84.0

        async def three() -> bool:
            return len(await entries(client, keys, "out")) == 3

        await wait_for(three, timeout=10, message="3 outputs")
    starts = [at for at, _, _ in model.requests]
    assert starts[2] - starts[0] >= 2.0 - 0.2


def completion_without_usage(text: str) -> dict[str, Any]:
    return {"id": "cmpl-2", "model": "tiny-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


async def test_a_response_without_usage_reports_no_cost_and_warns_once(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    """No ``usage``: the tokens are unknown, so nothing is reported (not 0 tokens and
    0 usd, which budgets would count as free calls), and the operator is told once."""
    keys = StreamKeys(prefix)
    model.default = Reply(payload=completion_without_usage("hi"))
    log = io.StringIO()
    configure_logging("info", json=True, stream=log)
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY", prices=PRICES)
    seen: list[int] = []
    outs = await run_until(client, keys, model_pipeline(llm, seen), 2)
    for out in outs:
        assert orjson.loads(out.get("cost") or "{}") == {}
        assert CODEC.decode(out, "out").data["text"] == "hi"
    warnings = [orjson.loads(line) for line in log.getvalue().splitlines()
                if "without usage" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0]["level"] == "warning"
    assert (warnings[0]["model"], warnings[0]["step"]) == ("tiny-1", "draft")


@pytest.mark.parametrize("estimate", [{"tokens": 500}, lambda message: {"tokens": 500}],
                         ids=["fixed", "function"])
async def test_a_response_without_usage_charges_the_steps_estimate(
    client: aioredis.Redis, prefix: str, model: FakeModel, estimate: Any
) -> None:
    """Before (issue 39): the reservation was released and 0 charged, so a budget never
    saw the call. Now what the step declared a call spends is what it spent: on the
    output's cost and in the run's budget (reserved first, then charged)."""
    keys = StreamKeys(prefix)
    model.default = Reply(payload=completion_without_usage("hi"))
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY", prices=PRICES)
    pipeline = Pipeline("m", ingress=["in"], cost_units=["tokens", "usd"],
                        budget=Budget(tokens=100_000))

    @pipeline.step("draft", consumes=["in"], produces=["out"], cost_units=["tokens", "usd"],
                   estimate=estimate)
    async def draft(message: Message) -> Output:
        done = await llm.complete(message, messages=[{"role": "user", "content": "?"}])
        return Output("out", {"text": done.text})

    (out,) = await run_until(client, keys, pipeline, 1)
    assert orjson.loads(out["cost"]) == {"tokens": 500}
    run = CODEC.decode(out, "out").correlation_id
    assert int(await client.hget(keys.budget(run), "tokens") or 0) == 500 * SPENT_SCALE
    assert await client.hlen(keys.reserved(run)) == 0, "the reservation became the charge"


@pytest.mark.parametrize("payload", [
    {"choices": []},
    {"choices": [{"index": 0, "message": {"role": "assistant"}}]},
    {"choices": [{"index": 0, "finish_reason": "stop"}]},
    {"id": "cmpl-3"},
], ids=["no-choices", "no-content", "no-message", "no-choices-key"])
async def test_a_response_without_a_completion_fails_the_entry_and_is_retried(
    client: aioredis.Redis, prefix: str, model: FakeModel, payload: dict[str, Any]
) -> None:
    keys = StreamKeys(prefix)
    model.script = [Reply(payload={**payload, "usage": {"prompt_tokens": 1,
                                                        "completion_tokens": 0}})]
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY")
    seen: list[int] = []
    (out,) = await run_until(client, keys, model_pipeline(llm, seen), 1)
    assert seen == [1, 2], "the empty answer failed the first delivery"
    assert CODEC.decode(out, "out").data["text"] == "echo 0"
    assert orjson.loads(out["cost"]) == {"tokens": 42}, "the failed call reported nothing"


async def test_an_empty_completion_says_so_in_its_dead_letter(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    keys = StreamKeys(prefix)
    model.default = Reply(payload={"choices": []})
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY")
    seen: list[int] = []
    (dead,) = await run_until(client, keys, model_pipeline(llm, seen, max_deliveries=1), 1,
                              event_type="dlq")
    assert "answered no completion (model tiny-1)" in dead["error"], dead["error"]
    assert await entries(client, keys, "out") == []


async def test_a_completion_of_tool_calls_or_content_parts_is_an_answer(
    client: aioredis.Redis, prefix: str, model: FakeModel
) -> None:
    keys = StreamKeys(prefix)
    usage = {"prompt_tokens": 3, "completion_tokens": 4}
    model.script = [
        Reply(payload={"choices": [{"message": {"role": "assistant", "content": None,
                                                "tool_calls": [{"id": "t1"}]}}],
                       "usage": usage}),
        Reply(payload={"choices": [{"message": {"role": "assistant", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}], "usage": usage}),
    ]
    llm = OpenAICompatible(model.url, "tiny-1", api_key_env="TEST_MODEL_KEY")
    seen: list[int] = []
    outs = await run_until(client, keys, model_pipeline(llm, seen, concurrency=1), 2)
    assert sorted(CODEC.decode(out, "out").data["text"] for out in outs) == ["", "ab"]
    assert seen == [1, 1]
