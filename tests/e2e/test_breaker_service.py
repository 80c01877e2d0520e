"""A model's circuit breaker as an operator sees it (reference: flow control and model
steps; HTTP): ``printery-workers`` runs an app whose step calls a model with a
``Breaker``; the breaker opened by another process (this test's) is on the service's
``/status`` and its ``printery_breaker_open{model}`` gauge, and the service's own entries
go to their fallback at once, without a request to the provider (a real HTTP server on
loopback that counts them)."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import Breaker, Message, ProviderDown
from printery.pipeline.models import OpenAICompatible
from printery.runtime.partials import PartialWriter, using
from printery.testing import unique_prefix, wait_for
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys
from support.service import spawn

APP = textwrap.dedent(
    """
    import os

    from printery import Breaker, Message, Output, Pipeline, escalate
    from printery.pipeline.models import OpenAICompatible

    llm = OpenAICompatible(os.environ["BREAKER_MODEL_URL"], "tiny-1", api_key_env=None,
                           breaker=Breaker(failures=3, window=30, reset=60))
    pipeline = Pipeline("b", ingress=["in"])


    async def primary(message: Message) -> Output:
        done = await llm.complete(message, messages=[{"role": "user", "content": "?"}])
        return Output("out", {"text": done.text})


    async def fallback(message: Message) -> Output:
        return Output("out", {"by": "fallback", "deliveries": message.deliveries})


    pipeline.step("draft", consumes=["in"], produces=["out"])(
        escalate(primary, attempts=3, fallback=fallback))
    """
)


class Down:
    """A provider that answers 500 to every request, and counts them."""

    def __init__(self) -> None:
        self.requests = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        return web.Response(status=500, headers={"Retry-After": "0"}, text="down")


@pytest.fixture
async def provider() -> AsyncIterator[tuple[Down, str]]:
    down = Down()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", down.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield down, f"http://{host}:{port}/v1"
    await runner.cleanup()


async def test_status_and_metric_show_an_open_breaker_and_entries_fall_back_at_once(
    redis_url: str, tmp_path: Path, provider: tuple[Down, str]
) -> None:
    down, url = provider
    (tmp_path / "breakerapp.py").write_text(APP)
    prefix = unique_prefix("breaker")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    token = using(PartialWriter(client, StreamKeys(prefix)))  # this test: another worker
    try:
        llm = OpenAICompatible(url, "tiny-1", api_key_env=None, max_attempts=4,
                               breaker=Breaker(failures=3, window=30, reset=60))
        envelope = Codec().new("in", {}, producer="test", correlation_id="run-0")
        with pytest.raises(ProviderDown):
            await llm.complete(Message(envelope=envelope, stream="p:in", entry_id="1-0",
                                       deliveries=1, worker="t", consumer="c", fields={}),
                               messages=[{"role": "user", "content": "?"}])
    finally:
        token.var.reset(token)
    assert down.requests == 3
    service = await asyncio.to_thread(
        spawn, ["--redis-url", redis_url, "--stream-prefix", prefix,
                "--app", "breakerapp:pipeline"], env={"BREAKER_MODEL_URL": url}, cwd=tmp_path)
    try:
        assert service.http_base is not None
        async with httpx.AsyncClient(base_url=service.http_base, timeout=10) as http:
            breaker = (await http.get("/status")).json()["breakers"]["tiny-1"]
            assert (breaker["state"], breaker["failures"]) == ("open", 3)
            assert 0 < breaker["trial_in_s"] <= 60

            async def gauge_open() -> bool:
                text = (await http.get("/metrics")).text
                return 'printery_breaker_open{model="tiny-1"} 1.0' in text

            await wait_for(gauge_open, timeout=20, message="printery_breaker_open 1")
            posted = await http.post("/v1/runs", json={"data": {"n": 1}, "event_type": "in"})
            assert posted.status_code == 202, posted.text
            run_id = posted.json()["run_id"]

            async def done() -> bool:
                return (await http.get(f"/v1/runs/{run_id}")).json().get("status") == "out"

            await wait_for(done, timeout=20, message="the run done")
            run = (await http.get(f"/v1/runs/{run_id}")).json()
        (out,) = [entry for entry in run["entries"] if entry["type"] == "out"]
        assert out["data"] == {"by": "fallback", "deliveries": 1}, run
        assert down.requests == 3, "the service's entry never reached the provider"
    finally:
        await asyncio.to_thread(service.stop)
        await client.aclose()
