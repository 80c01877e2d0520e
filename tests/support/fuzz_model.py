"""The composition fuzz's model provider: an OpenAI-compatible chat-completions server on
loopback that streams every answer whole, except the first request of each entry whose
prompt asks for a cut: that one ends half-way, by closing the connection or by a clean
end of body, without ``[DONE]`` or a ``finish_reason`` (the model step must take it as
broken, retry it and retract what it showed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

BASE = {"id": "fuzz-1", "object": "chat.completion.chunk", "model": "fuzz"}
HALF: list[Any] = [{**BASE, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                   {**BASE, "choices": [{"index": 0, "delta": {"content": "half "}}]}]
WHOLE: list[Any] = [
    *HALF, {**BASE, "choices": [{"index": 0, "delta": {"content": "whole"}}]},
    {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {**BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                      "total_tokens": 5}},
    "[DONE]",
]
#: How a cut answer ends: closed mid-body (no chunked end), or a clean end too early.
CUTS = ("closed", "clean")


class FuzzModel:
    """Answers each request; counts the cuts it made."""

    def __init__(self) -> None:
        self.url = ""
        self.cut: set[str] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            found = re.search(rb"content-length:\s*(\d+)", head, re.I)
            body = json.loads(await reader.readexactly(int(found.group(1)) if found else 0))
            ask = json.loads(body["messages"][0]["content"])
            cut = ask.get("cut") if ask.get("key") not in self.cut else None
            if cut:
                self.cut.add(ask["key"])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in HALF if cut else WHOLE:
                data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data.encode()))
                await writer.drain()
            if cut != "closed":
                writer.write(b"0\r\n\r\n")  # the body ends (too early when cut)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError):
            pass  # a client that went away (its step timed out): nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def fuzz_model() -> AsyncIterator[FuzzModel]:
    model = FuzzModel()
    server = await asyncio.start_server(model.serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    model.url = f"http://{host}:{port}/v1"
    try:
        yield model
    finally:
        server.close()
        await server.wait_closed()
