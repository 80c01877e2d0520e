"""Quota-aware fallbacks (reference: flow control and model steps): a provider whose quota
is gone, and a limit that would hold an entry too long, send the work to the step's
fallback at once instead of retrying or queueing it. ``OpenAICompatible`` talks to a
real HTTP server on loopback; the pipeline, the server and the workers are real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import (
    Limit,
    Loop,
    Message,
    Output,
    Pipeline,
    PipelineError,
    QuotaExhausted,
    Reject,
    escalate,
)
from printery.observe.metrics import Metrics, MetricsObserver
from printery.pipeline.models import OpenAICompatible
from printery.runtime.consumer import ConsumerSettings
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import CODEC, publish, running_pipeline

#: What the provider answers, by case: a status, headers and a body.
QUOTA_GONE = {
    "402": (402, {}, '{"error": {"message": "payment required"}}'),
    "insufficient_quota": (429, {}, '{"error": {"message": "You exceeded your current quota",'
                                    ' "type": "insufficient_quota", "code": "insufficient_quota"}}'),
    "retry-after-3-days": (429, {"Retry-After": "259200"}, '{"error": {"message": "slow down"}}'),
}


@dataclass
class Provider:
    """A chat-completions endpoint that answers every request with one refusal."""

    status: int
    headers: dict[str, str]
    body: str
    url: str = ""
    requests: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        return web.Response(status=self.status, headers=self.headers, text=self.body,
                            content_type="application/json")


@pytest.fixture(params=sorted(QUOTA_GONE))
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[Provider]:
    status, headers, body = QUOTA_GONE[request.param]
    found = Provider(status, headers, body)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", found.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    found.url = f"http://{host}:{port}/v1"
    yield found
    await runner.cleanup()


def settings() -> ConsumerSettings:
    return ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                            claim_interval=0.1)


async def written(client: aioredis.Redis, keys: StreamKeys, event_type: str, n: int = 1
                  ) -> list[dict[str, str]]:
    async def found() -> list[dict[str, str]]:
        entries = [fields for _, fields in await client.xrange(keys.stream(event_type))]
        return entries if len(entries) >= n else []

    return await wait_for(found, timeout=15, message=f"{n} {event_type}")


async def test_a_quota_refusal_goes_to_the_fallback_at_once_without_a_retry(
    client: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    """402, 429 ``insufficient_quota`` and a 429 asking to come back in three days: the
    model call raises ``QuotaExhausted`` on its first request, and the escalated step's
    fallback answers on the entry's first delivery, with 3 attempts allowed."""
    keys = StreamKeys(prefix)
    llm = OpenAICompatible(provider.url, "tiny-1", api_key_env=None, max_attempts=4)
    deliveries: list[tuple[str, int]] = []
    raised: list[BaseException] = []

    async def primary(message: Message) -> Output:
        deliveries.append(("primary", message.deliveries))
        try:
            await llm.complete(message, messages=[{"role": "user", "content": "hi"}])
        except BaseException as exc:
            raised.append(exc)
            raise
        raise AssertionError("the provider refuses every call")

    async def other_provider(message: Message) -> Output:
        deliveries.append(("fallback", message.deliveries))
        return Output("out", {"by": "fallback"})

    pipeline = Pipeline("q", ingress=["in"])
    pipeline.step("draft", consumes=["in"], produces=["out"])(
        escalate(primary, attempts=3, fallback=other_provider))
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await publish(client, keys, "in", 1)
        (out,) = await written(client, keys, "out")
    assert CODEC.decode(out, "out").data == {"by": "fallback"}
    assert deliveries == [("primary", 1), ("fallback", 1)]
    assert provider.requests == 1, "not asked again"
    (error,) = raised
    assert isinstance(error, QuotaExhausted) and isinstance(error, Reject)
    assert error.reason_code == "quota_exhausted"
    assert str(provider.status) in str(error)


async def test_a_loop_goes_to_its_fallback_at_once_on_a_quota_refusal(
    client: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    """The loop's first attempt meets the quota: no redelivery, no second attempt; the
    fallback's output passes and is the loop's, its verdicts naming the reason."""
    keys = StreamKeys(prefix)
    llm = OpenAICompatible(provider.url, "tiny-1", api_key_env=None)

    async def work(message: Message) -> str:
        done = await llm.complete(message, messages=[{"role": "user", "content": "hi"}])
        return done.text

    async def fallback(message: Message) -> str:
        return "from the fallback"

    pipeline = Pipeline("q", ingress=["in"])
    pipeline.add(Loop("write", consumes="in", produces="out", work=work,
                      validate=lambda message: [], max_attempts=3, fallback=fallback))
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await publish(client, keys, "in", 1)
        (out,) = await written(client, keys, "out")
    assert CODEC.decode(out, "out").data == "from the fallback"
    assert provider.requests == 1
    verdicts = [CODEC.decode(fields, "write:loop").data
                for _, fields in await client.xrange(keys.stream("write:loop"))
                if fields.get("type") == "write:verdict"]
    first, last = verdicts
    assert (first["attempt"], first["next"]) == (1, "fallback")
    assert [r["code"] for r in first["reasons"]] == ["quota_exhausted"]
    assert (last["attempt"], last["fallback"], last["passed"]) == (2, True, True)


async def test_without_a_fallback_a_quota_refusal_is_dead_lettered_at_once(
    client: aioredis.Redis, prefix: str
) -> None:
    """A plain step: ``QuotaExhausted`` is not retried (one delivery of five), its dead
    letter says why."""
    keys = StreamKeys(prefix)
    calls: list[int] = []

    async def handler(message: Message) -> Output:
        calls.append(message.deliveries)
        raise QuotaExhausted("monthly quota used up", retry_after=259200)

    pipeline = Pipeline("q", ingress=["in"])
    pipeline.step("draft", consumes=["in"], produces=["out"], max_deliveries=5)(handler)
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await publish(client, keys, "in", 1)
        (dead,) = await written(client, keys, "dlq")
    assert calls == [1]
    assert dead["reason_code"] == "quota_exhausted"
    assert "monthly quota used up" in dead["error"]


def test_a_short_retry_after_is_a_rate_limit_and_max_wait_is_checked() -> None:
    with pytest.raises(PipelineError, match="max_wait"):
        OpenAICompatible("http://127.0.0.1:9/v1", "m", api_key_env=None, max_wait=0)
    with pytest.raises(PipelineError, match="max_wait"):
        Limit("api", concurrency=1, max_wait=-1)


async def test_a_saturated_limit_with_max_wait_sends_work_to_the_fallback(
    client: aioredis.Redis, prefix: str
) -> None:
    """``Limit(concurrency=1, max_wait=1)``: the first entry holds the slot until the test
    lets it go; the second would wait for it, and after a second runs the fallback
    instead, while the slot is still held, on its first delivery. The wait is counted
    in ``printery_limit_fallbacks_total{limit}``."""
    keys = StreamKeys(prefix)
    release = asyncio.Event()
    calls: list[tuple[str, int, int]] = []

    async def primary(message: Message) -> Output:
        calls.append(("primary", message.data["n"], message.deliveries))
        await release.wait()
        return Output("out", {"n": message.data["n"], "by": "primary"})

    async def fallback(message: Message) -> Output:
        calls.append(("fallback", message.data["n"], message.deliveries))
        return Output("out", {"n": message.data["n"], "by": "fallback",
                              "over": message.over_limit})

    metrics = Metrics(process_metrics=False)
    pipeline = Pipeline("q", ingress=["in"])
    pipeline.step("draft", consumes=["in"], produces=["out"], concurrency=2,
                  limits=[Limit("llm", concurrency=1, max_wait=1)])(
        escalate(primary, attempts=3, fallback=fallback))
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings(),
                                observer=MetricsObserver(metrics)):
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _true(len(calls) == 1), timeout=10, message="the slot taken")
        began = asyncio.get_running_loop().time()
        await publish(client, keys, "in", 1, start=1)
        (out,) = await written(client, keys, "out")
        waited = asyncio.get_running_loop().time() - began
        assert not release.is_set()
        assert CODEC.decode(out, "out").data == {"n": 1, "by": "fallback", "over": "llm"}
        release.set()
        await written(client, keys, "out", 2)
    assert calls == [("primary", 0, 1), ("fallback", 1, 1)]
    assert 1.0 <= waited < 5.0
    assert 'printery_limit_fallbacks_total{limit="llm"} 1.0' in metrics.render().decode()


async def test_without_a_fallback_max_wait_waits_as_before(
    client: aioredis.Redis, prefix: str
) -> None:
    """A step with no fallback: the entry waits out the slot, past ``max_wait``."""
    keys = StreamKeys(prefix)
    release = asyncio.Event()
    order: list[int] = []

    async def handler(message: Message) -> Output:
        order.append(message.data["n"])
        if message.data["n"] == 0:
            await release.wait()
        return Output("out", message.data)

    metrics = Metrics(process_metrics=False)
    pipeline = Pipeline("q", ingress=["in"])
    pipeline.step("draft", consumes=["in"], produces=["out"], concurrency=2,
                  limits=[Limit("llm", concurrency=1, max_wait=0.2)])(handler)
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings(),
                                observer=MetricsObserver(metrics)) as manager:
        await publish(client, keys, "in", 1)
        await wait_for(lambda: _true(order == [0]), timeout=10, message="the slot taken")
        await publish(client, keys, "in", 1, start=1)

        async def waiting() -> bool:
            limits: Any = manager.get_status()["draft"].get("limits", {})
            return bool(limits) and limits["llm"]["waiting"] == 1

        await wait_for(waiting, timeout=10, message="the second entry waiting")
        # The subject is time passing: past max_wait, the entry still waits.
        await asyncio.sleep(0.6)
        assert order == [0]
        release.set()
        outs = await written(client, keys, "out", 2)
    assert sorted(orjson.loads(o["data"])["n"] for o in outs) == [0, 1]
    assert "printery_limit_fallbacks_total{" not in metrics.render().decode()


async def _true(value: bool) -> bool:
    return value
