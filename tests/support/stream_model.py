"""An OpenAI-compatible chat-completions server that streams (server-sent events, as
``stream=True`` asks), on loopback: the external boundary of a streaming model step.

Each streamed answer sends its chunks one by one; ``hold`` (when set) keeps the last
content chunk back until the test releases it, so a test can see partials on the server
while the model is still answering, with no sleep."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

#: An app (``streamapp:pipeline``) whose Loop streams its drafts: attempt n shows
#: ``draft n: ``, then holds until the test pushes to ``<STREAM_GATES>:<run>:<n>`` (a
#: list: the wait is a BLPOP, no sleep), then shows ``the end``; attempt 2 passes. Its
#: step ``idle`` (of a type no one writes) lets a process serve HTTP without the loop
#: (``--worker idle``): one that can be killed without touching the run.
STREAM_APP = textwrap.dedent(
    """
    import os

    import redis.asyncio as aioredis

    from printery import Loop, Message, Pipeline, Reason

    GATES = os.environ["STREAM_GATES"]
    pipeline = Pipeline("drafts", ingress=["request", "never"], outcomes=["answer"])
    _gates = []


    async def work(message: Message):
        if not _gates:
            _gates.append(aioredis.Redis.from_url(os.environ["STREAM_REDIS"],
                                                  decode_responses=True))
        yield f"draft {message.attempt}: "
        gate = f"{GATES}:{message.correlation_id}:{message.attempt}"
        if await _gates[0].blpop([gate], timeout=60) is None:
            raise RuntimeError("the test never opened " + gate)
        yield "the end"


    def validate(message: Message) -> list:
        if message.data.startswith("draft 2"):
            return []
        return [Reason("not_yet", "", f"attempt {message.attempt} is a first draft")]


    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=validate, max_attempts=3))


    @pipeline.step("idle", consumes=["never"], produces=["never:done"])
    async def idle(message: Message) -> None:
        return None
    """
)


@dataclass
class StreamModel:
    """Answers every request by streaming ``chunks`` (then a usage chunk and ``[DONE]``);
    records each request's body."""

    chunks: Sequence[str] = ("The ", "answer ", "is ", "42.")
    prompt_tokens: int = 7
    completion_tokens: int = 4
    #: Set: the last content chunk waits for :meth:`release`.
    hold: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the chunks before the held one were sent.
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if not body.get("stream"):
            return web.json_response({"error": "this server only streams"}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(payload: dict[str, Any] | str) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {text}\n\n".encode())

        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"]}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        await response.write(b": keep-alive\n\n")
        for n, chunk in enumerate(self.chunks):
            if self.hold and n == len(self.chunks) - 1:
                self.holding.set()
                await self._released.wait()
            await send({**base, "choices": [{"index": 0, "delta": {"content": chunk}}]})
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if body.get("stream_options", {}).get("include_usage"):
            await send({**base, "choices": [], "usage": {
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}})
        await send("[DONE]")
        await response.write_eof()
        return response


@asynccontextmanager
async def serving(model: StreamModel) -> AsyncIterator[StreamModel]:
    """``model`` served on a free loopback port (``model.url`` is its ``.../v1``)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    model.url = f"http://{host}:{port}/v1"
    try:
        yield model
    finally:
        model.release()
        await runner.cleanup()
