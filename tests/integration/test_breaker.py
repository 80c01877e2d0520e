"""A provider that is down is found once, not per entry (reference: flow
control and model steps): ``OpenAICompatible(..., breaker=Breaker(...))`` keeps its
breaker in the server, so every process calling the model shares it. The provider is a
real HTTP server on loopback that counts the requests it gets; each "process" here has a
connection and a model instance of its own (one is a real subprocess), and a real
pipeline shows the fallback run at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from printery import (
    Breaker,
    Loop,
    Message,
    Output,
    Pipeline,
    PipelineError,
    ProviderDown,
    Retry,
    escalate,
)
from printery.pipeline.models import OpenAICompatible
from printery.runtime.breaker import breaker_states
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.partials import PartialWriter, using
from printery.servers.process import free_port
from printery.testing import wait_for
from printery.transport.connection import connect
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys
from support.cluster import ValkeyCluster
from support.spine import CODEC, publish, running_pipeline

MODEL = "tiny-1"
ASK = [{"role": "user", "content": "?"}]


@dataclass
class Provider:
    """A chat-completions endpoint answering ``status`` (500: down) to every request;
    with ``hold`` set, a request waits for it before answering."""

    status: int = 500
    hold: asyncio.Event | None = None
    requests: int = 0
    url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.status != 200:
            return web.Response(status=self.status, headers={"Retry-After": "0"},
                                text="upstream down")
        return web.json_response({"choices": [{"message": {"role": "assistant",
                                                           "content": "fine"}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    found = Provider()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", found.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    found.url = f"http://{host}:{port}/v1"
    yield found
    if found.hold is not None:
        found.hold.set()
    await runner.cleanup()


@pytest.fixture
async def other(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A second connection to the server: another process's."""
    conn = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    await conn.aclose()


@contextlib.contextmanager
def worker_of(client: aioredis.Redis, prefix: str) -> Iterator[None]:
    """Calls made here are a worker's of ``client``'s process: its breaker is asked on
    that connection (what a handler's context has in a running worker)."""
    token = using(PartialWriter(client, StreamKeys(prefix)))
    try:
        yield
    finally:
        token.var.reset(token)


def message() -> Message:
    envelope = Codec().new("in", {}, producer="test", correlation_id="run-1")
    return Message(envelope=envelope, stream="p:in", entry_id="1-0", deliveries=1,
                   worker="ask", consumer="c", fields={})


def model(provider: Provider, breaker: Breaker, **given: Any) -> OpenAICompatible:
    return OpenAICompatible(provider.url, given.pop("name", MODEL), api_key_env=None,
                            breaker=breaker, **given)


async def opened(client: aioredis.Redis, prefix: str, provider: Provider,
                 breaker: Breaker) -> ProviderDown:
    """The breaker opened by one call of this process (three failed requests of its four
    attempts: the fourth is refused): what it raised."""
    with worker_of(client, prefix), pytest.raises(ProviderDown) as raised:
        await model(provider, breaker, max_attempts=4).complete(message(), messages=ASK)
    assert provider.requests == breaker.failures == 3
    return raised.value


async def state_of(client: aioredis.Redis, prefix: str) -> dict[str, Any]:
    return (await breaker_states(client, StreamKeys(prefix)))[MODEL]


def test_a_breaker_is_checked_when_it_is_declared() -> None:
    for wrong in ({"failures": 0}, {"failures": 1.5}, {"window": 0}, {"reset": -1},
                  {"reset": float("inf")}):
        with pytest.raises(PipelineError, match="Breaker"):
            Breaker(**wrong)
    with pytest.raises(PipelineError, match="breaker"):
        OpenAICompatible("http://127.0.0.1:9/v1", "m", api_key_env=None,
                         breaker={"failures": 5})  # type: ignore[arg-type]


async def test_failures_open_the_breaker_for_every_process_sharing_the_server(
    client: aioredis.Redis, other: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    """Three failed requests open it: the call that met the third is refused its fourth
    attempt, and another process's model (its own instance, its own connection) is
    refused at once; the provider never hears of either. Another model is not."""
    breaker = Breaker(failures=3, window=30, reset=60)
    down = await opened(client, prefix, provider, breaker)
    assert isinstance(down, Retry) and down.model == MODEL
    assert down.delay is not None and 50 < down.delay <= 60, "retried after the reset"
    with worker_of(other, prefix), pytest.raises(ProviderDown):
        await model(provider, breaker).complete(message(), messages=ASK)
    assert provider.requests == 3, "refused without a request"
    state = await state_of(other, prefix)
    assert (state["state"], state["failures"]) == ("open", 3)
    assert 50 < state["trial_in_s"] <= 60
    with worker_of(other, prefix), pytest.raises(Retry) as failed:
        await model(provider, breaker, name="tiny-2", max_attempts=1).complete(
            message(), messages=ASK)
    assert not isinstance(failed.value, ProviderDown) and provider.requests == 4


async def test_a_success_resets_the_count_of_consecutive_failures(
    client: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    llm = model(provider, Breaker(failures=3, window=30, reset=60), max_attempts=1)

    async def call() -> str:
        try:
            with worker_of(client, prefix):
                return (await llm.complete(message(), messages=ASK)).text
        except ProviderDown:
            return "refused"
        except Retry:
            return "failed"

    assert [await call(), await call()] == ["failed", "failed"]
    assert (await state_of(client, prefix))["failures"] == 2
    provider.status = 200
    assert await call() == "fine"
    assert (await state_of(client, prefix)) == {"state": "closed", "failures": 0}
    provider.status = 500
    assert [await call() for _ in range(4)] == ["failed", "failed", "failed", "refused"]
    assert provider.requests == 6


async def test_after_the_reset_one_trial_call_decides(
    client: aioredis.Redis, other: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    """Once the reset is over one caller makes the trial; while it is under way every
    other caller (another process too) is refused; its success closes the breaker. A
    failed trial opens it again for another reset."""
    breaker = Breaker(failures=3, window=30, reset=0.5)
    await opened(client, prefix, provider, breaker)

    async def half_open() -> bool:
        return (await state_of(client, prefix))["state"] == "half_open"

    await wait_for(half_open, timeout=10, message="the reset over")
    provider.status, provider.hold = 200, asyncio.Event()
    provider.arrived.clear()
    with worker_of(client, prefix):
        trial = asyncio.create_task(model(provider, breaker).complete(message(), messages=ASK))
    await asyncio.wait_for(provider.arrived.wait(), 10)
    for connection in (client, other):
        with worker_of(connection, prefix), pytest.raises(ProviderDown):
            await model(provider, breaker).complete(message(), messages=ASK)
    assert provider.requests == 4, "one trial, the others refused without a request"
    provider.hold.set()
    assert (await asyncio.wait_for(trial, 10)).text == "fine"
    assert (await state_of(other, prefix))["state"] == "closed"
    with worker_of(other, prefix):
        assert (await model(provider, breaker).complete(message(), messages=ASK)).text == "fine"
    assert provider.requests == 5

    provider.status, provider.hold = 500, None
    provider.requests = 0
    await opened(client, prefix, provider, breaker)
    await wait_for(half_open, timeout=10, message="the reset over again")
    with worker_of(other, prefix), pytest.raises(ProviderDown):  # the trial fails: open
        await model(provider, breaker, max_attempts=2).complete(message(), messages=ASK)
    assert provider.requests == 4
    assert (await state_of(client, prefix))["state"] == "open"


async def test_another_process_is_refused_by_a_breaker_this_one_opened(
    client: aioredis.Redis, redis_url: str, prefix: str, provider: Provider
) -> None:
    """A real subprocess, its own interpreter and connection, same server and model."""
    breaker = Breaker(failures=3, window=30, reset=60)
    await opened(client, prefix, provider, breaker)
    code = textwrap.dedent(f"""
        import asyncio
        import redis.asyncio as aioredis
        from printery import Breaker, Message, ProviderDown
        from printery.wire.envelope import Codec
        from printery.wire.keys import StreamKeys
        from printery.pipeline.models import OpenAICompatible
        from printery.runtime.partials import PartialWriter, using

        async def main():
            client = aioredis.Redis.from_url({redis_url!r}, decode_responses=True)
            using(PartialWriter(client, StreamKeys({prefix!r})))
            llm = OpenAICompatible({provider.url!r}, {MODEL!r}, api_key_env=None,
                                   breaker=Breaker(failures=3, window=30, reset=60))
            envelope = Codec().new("in", {{}}, producer="test", correlation_id="run-2")
            message = Message(envelope=envelope, stream="p:in", entry_id="1-0",
                              deliveries=1, worker="ask", consumer="c", fields={{}})
            try:
                await llm.complete(message, messages=[{{"role": "user", "content": "?"}}])
            except ProviderDown as exc:
                print("refused", round(exc.delay))
            await client.aclose()

        asyncio.run(main())
    """)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=dict(os.environ), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    said, seconds = out.decode().split()
    assert said == "refused" and 50 < int(seconds) <= 60
    assert provider.requests == 3


def settings() -> ConsumerSettings:
    return ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                            claim_interval=0.1)


async def written(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> dict[str, str]:
    async def found() -> list[dict[str, str]]:
        return [fields for _, fields in await client.xrange(keys.stream(event_type))]

    (entry,) = await wait_for(found, timeout=15, message=event_type)
    return entry


async def test_an_open_breaker_sends_the_entry_to_the_fallback_at_once(
    client: aioredis.Redis, other: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    """An escalated step and a Loop, in a running pipeline of another process: the
    model's first call is refused, and the fallback answers on the first delivery,
    with attempts left; the loop's verdict names ``provider_down``."""
    breaker = Breaker(failures=3, window=30, reset=60)
    await opened(client, prefix, provider, breaker)
    keys = StreamKeys(prefix)
    llm = model(provider, breaker)
    calls: list[tuple[str, int]] = []

    async def primary(message: Message) -> Output:
        calls.append(("primary", message.deliveries))
        return Output("out", {"text": (await llm.complete(message, messages=ASK)).text})

    async def fallback(message: Message) -> Output:
        calls.append(("fallback", message.deliveries))
        return Output("out", {"by": "fallback"})

    async def work(message: Message) -> str:
        return (await llm.complete(message, messages=ASK)).text

    async def other_model(message: Message) -> str:
        return "from the fallback"

    pipeline = Pipeline("b", ingress=["in", "ask"])
    pipeline.step("draft", consumes=["in"], produces=["out"], max_deliveries=5)(
        escalate(primary, attempts=3, fallback=fallback))
    pipeline.add(Loop("write", consumes="ask", produces="answer", work=work,
                      validate=lambda message: [], max_attempts=3, fallback=other_model))
    async with running_pipeline(pipeline, client=other, keys=keys, settings=settings()):
        await publish(other, keys, "in", 1)
        await publish(other, keys, "ask", 1, start=1)  # a run of its own: one outcome each
        out = await written(other, keys, "out")
        answer = await written(other, keys, "answer")
    assert CODEC.decode(out, "out").data == {"by": "fallback"}
    assert calls == [("primary", 1), ("fallback", 1)]
    assert CODEC.decode(answer, "answer").data == "from the fallback"
    first, last = [CODEC.decode(fields, "write:loop").data
                   for _, fields in await client.xrange(keys.stream("write:loop"))
                   if fields.get("type") == "write:verdict"]
    assert (first["attempt"], first["next"]) == (1, "fallback")
    assert [r["code"] for r in first["reasons"]] == ["provider_down"]
    assert (last["fallback"], last["passed"]) == (True, True)
    assert provider.requests == 3, "no entry reached the provider"


async def test_a_breaker_on_a_cluster_of_partitions(
    cluster: ValkeyCluster, prefix: str, provider: Provider
) -> None:
    """Nine partitions over three masters: the breaker's key is not a run's (no
    partition), and its script and /status's read of it run on the master of its slot."""
    keys = StreamKeys(prefix, 9)
    mine, theirs = connect(cluster.url), connect(cluster.url)
    breaker = Breaker(failures=3, window=30, reset=60)
    try:
        for client in (mine, theirs):
            token = using(PartialWriter(client, keys))
            try:
                with pytest.raises(ProviderDown):
                    await model(provider, breaker, max_attempts=4).complete(
                        message(), messages=ASK)
            finally:
                token.var.reset(token)
        assert provider.requests == 3
        state = (await breaker_states(theirs, keys))[MODEL]
        assert (state["state"], state["failures"]) == ("open", 3)
    finally:
        await mine.aclose()
        await theirs.aclose()


async def test_a_breaker_the_server_cannot_be_asked_about_lets_the_call_through(
    prefix: str, provider: Provider
) -> None:
    """The breaker is advisory: a server that does not answer fails no model call (the
    worker's commit waits for the server as any does)."""
    provider.status = 200
    nowhere = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1,
                             decode_responses=True)
    try:
        with worker_of(nowhere, prefix):
            done = await model(provider, Breaker(failures=1)).complete(message(), messages=ASK)
    finally:
        await nowhere.aclose()
    assert done.text == "fine" and provider.requests == 1


async def test_failures_further_apart_than_the_window_do_not_open_it(
    client: aioredis.Redis, prefix: str, provider: Provider
) -> None:
    llm = model(provider, Breaker(failures=2, window=0.3, reset=60), max_attempts=1)
    with worker_of(client, prefix):
        with pytest.raises(Retry):
            await llm.complete(message(), messages=ASK)

        async def forgotten() -> bool:  # on the server's clock, as the script judges
            return (await state_of(client, prefix))["failures"] == 0

        await wait_for(forgotten, timeout=10, message="the first failure out of the window")
        with pytest.raises(Retry) as second:
            await llm.complete(message(), messages=ASK)
    assert not isinstance(second.value, ProviderDown)
    assert await state_of(client, prefix) == {"state": "closed", "failures": 1}
    assert provider.requests == 2
