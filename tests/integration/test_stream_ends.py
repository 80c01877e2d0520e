"""A streamed answer is complete only with its end (reference: flow control
and model steps): an OpenAI-compatible stream that stops without ``data: [DONE]`` and
without a choice's ``finish_reason`` (the connection closed half-way, or the body ended
cleanly) is a broken answer: the call is a ``Retry``, the draft it showed is retracted
and the next delivery's complete answer is the step's, charged once.

The provider is a real HTTP server on loopback written at the socket level, so it can
end a response the ways a gateway does: a close-delimited body closed half-way, a
chunked body cut without its last chunk, a chunked body ended cleanly too early."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import Message, Output, Pipeline, StreamKeys
from printery.pipeline.models import OpenAICompatible
from support.spine import pipeline_starter

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "tiny-1"}
ROLE = {**BASE, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}


def delta(text: str) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": 0, "delta": {"content": text}}]}


FINISH = {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
USAGE = {**BASE, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4,
                                          "total_tokens": 11}}
HALF = [ROLE, delta("The answer ")]
WHOLE = [*HALF, delta("is 42."), FINISH, USAGE, "[DONE]"]

#: How a response is sent: its events, whether chunked (else close-delimited) and whether
#: its body ends properly (the last chunk of a chunked body; a close-delimited one always
#: ends by closing).
CASES: dict[str, tuple[list[Any], bool, bool]] = {
    "whole": (WHOLE, True, True),
    "closed-half-way": (HALF, False, True),
    "chunked-cut-half-way": (HALF, True, False),
    "clean-end-too-early": (HALF, True, True),
    "finish-without-done": ([*HALF, delta("is 42."), FINISH, USAGE], True, True),
    "cut-after-finish": ([*HALF, delta("is 42."), FINISH], True, False),
}


class RawModel:
    """A streaming chat-completions server answering each request with the next case of
    ``script`` (then ``whole``); counts the requests."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.requests = 0
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            found = re.search(rb"content-length:\s*(\d+)", head, re.I)
            await reader.readexactly(int(found.group(1)) if found else 0)
            self.requests += 1
            events, chunked, ends = CASES[self.script.pop(0) if self.script else "whole"]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Connection: close\r\n"
                         + (b"Transfer-Encoding: chunked\r\n" if chunked else b"") + b"\r\n")
            for event in events:
                text = event if isinstance(event, str) else json.dumps(event)
                data = f"data: {text}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                await writer.drain()
            if chunked and ends:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def raw_model(script: list[str]) -> AsyncIterator[RawModel]:
    model = RawModel(script)
    server = await asyncio.start_server(model.serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    model.url = f"http://{host}:{port}/v1"
    try:
        yield model
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def running(redis_url: str, client: aioredis.Redis, prefix: str) -> AsyncIterator[Any]:
    async with pipeline_starter(redis_url, client, prefix, max_deliveries=3) as start:
        yield start


def asking(llm: OpenAICompatible, **step: Any) -> Pipeline:
    pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens"])

    @pipeline.step("ask", consumes=["request"], produces=["answer"], cost_units=["tokens"],
                   **step)
    async def ask(message: Message) -> Output:
        done = await llm.complete(message, messages=[{"role": "user", "content": "?"}],
                                  stream=True)
        return Output("answer", {"text": done.text})

    return pipeline


async def drafts(client: aioredis.Redis, prefix: str, run_id: str) -> list[tuple[str, str]]:
    """The run's partials stream as (kind, text or passed)."""
    found: list[tuple[str, str]] = []
    for _, fields in await client.xrange(StreamKeys(prefix).of(run_id).partials(run_id)):
        if fields["kind"] == "partial":
            if found and found[-1][0] == "partial":
                found[-1] = ("partial", found[-1][1] + fields["text"])
                continue
            found.append(("partial", fields["text"]))
        else:
            found.append((fields["kind"], fields.get("passed", "")))
    return found


@pytest.mark.parametrize("cut", ["closed-half-way", "chunked-cut-half-way",
                                 "clean-end-too-early"])
async def test_a_stream_that_ends_before_its_end_is_retried_and_its_draft_retracted(
    running: Any, client: aioredis.Redis, prefix: str, cut: str
) -> None:
    """Before (issue 39): the close-delimited body closed half-way and the chunked body
    ended cleanly too early were taken as the answer ``The answer `` (run done, its
    tokens never billed)."""
    async with raw_model([cut]) as model:
        llm = OpenAICompatible(model.url, "tiny-1", api_key_env=None)
        submitter = await running(asking(llm))
        run_id = await submitter.submit({"question": "why?"})
        result = await submitter.result(run_id, timeout=30)
    assert result.data == {"text": "The answer is 42."}
    assert result.cost == {"tokens": 11}, "only the complete answer is charged"
    assert model.requests == 2
    assert await drafts(client, prefix, run_id) == [
        ("partial", "The answer "), ("verdict", "0"), ("restart", "0"),
        ("partial", "The answer is 42."), ("verdict", "1")]


@pytest.mark.parametrize("case", ["finish-without-done", "cut-after-finish"])
async def test_a_stream_whose_choice_finished_is_complete_without_done(
    running: Any, client: aioredis.Redis, prefix: str, case: str
) -> None:
    """A ``finish_reason`` ends the answer: no ``[DONE]`` needed, and a connection that
    closes after it loses only the usage (then the step's estimate is charged)."""
    async with raw_model([case]) as model:
        llm = OpenAICompatible(model.url, "tiny-1", api_key_env=None)
        submitter = await running(asking(llm, estimate={"tokens": 500}))
        run_id = await submitter.submit({"question": "why?"})
        result = await submitter.result(run_id, timeout=30)
    assert result.data == {"text": "The answer is 42."}
    assert model.requests == 1
    expected = {"tokens": 11} if case == "finish-without-done" else {"tokens": 500}
    assert result.cost == expected
