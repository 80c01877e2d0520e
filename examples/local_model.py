"""An OpenAI-compatible chat-completions server that streams (server-sent events, as
``stream=True`` asks), on loopback: the model an example talks to when no real endpoint
is configured, and the external boundary of the streaming tests (one server for both).

Each streamed answer sends its chunks one by one, then a usage chunk and ``[DONE]``;
``hold`` (when set) keeps the last content chunk back until :meth:`StreamModel.release`,
so a test can see partials on the server while the model is still answering, with no
sleep. ``out_of_quota`` plays a provider whose quota is gone: it answers 429
``insufficient_quota`` as OpenAI does, which a quota-aware client must not retry."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["StreamModel", "serving"]

#: What OpenAI answers when an account's quota (not its rate) has run out.
QUOTA_GONE = {"error": {"type": "insufficient_quota", "code": "insufficient_quota",
                        "message": "You exceeded your current quota, please check your plan "
                                   "and billing details."}}


@dataclass
class StreamModel:
    """Answers every request by streaming ``chunks`` (or what ``answer`` makes of the
    request's body), then a usage chunk and ``[DONE]``; records each request's body."""

    chunks: Sequence[str] = ("The ", "answer ", "is ", "42.")
    #: The chunks of one request's answer, from its body (None: ``chunks``).
    answer: Callable[[dict[str, Any]], Sequence[str]] | None = None
    #: True for a request that finds the account's quota gone (429 ``insufficient_quota``).
    out_of_quota: Callable[[dict[str, Any]], bool] | None = None
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
        if self.out_of_quota is not None and self.out_of_quota(body):
            return web.json_response(QUOTA_GONE, status=429)
        chunks = self.chunks if self.answer is None else self.answer(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(payload: dict[str, Any] | str) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {text}\n\n".encode())

        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"]}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        await response.write(b": keep-alive\n\n")
        for n, chunk in enumerate(chunks):
            if self.hold and n == len(chunks) - 1:
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
