"""Streaming through the gate (reference: streaming through the gate) end to end: a
``printery-workers --app`` process runs a validation loop whose ``work`` streams its
draft; the test follows the run with :meth:`Client.watch` and with the HTTP event stream
read the way an ``EventSource`` reads it (reconnecting with ``Last-Event-ID``), and
joins late with a second watcher. Each attempt holds before its last chunk until the
test has seen its first one (a list the test pushes to: no sleep).

What every follower sees: the partials of attempt 1 before its verdict, the retraction
with the validator's reasons, then attempt 2's partials, its verdict, then the outcome;
the late follower sees attempt 2 from its start and nothing of attempt 1's draft; the
event stream's reconnect loses no committed entry and gives none twice."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from printery import Client, Partial, Verdict
from printery.testing import unique_prefix
from support.service import spawn
from support.stream_model import STREAM_APP

REASONS = [{"code": "not_yet", "field": "", "message": "attempt 1 is a first draft"}]
Item = dict[str, Any] | Partial | Verdict


@dataclass
class Seen:
    """What one follower got so far; ``changed`` wakes whoever waits on it."""

    items: list[Any] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, item: Any) -> None:
        self.items.append(item)
        self.changed.set()

    async def until(self, check: Callable[[list[Any]], bool], what: str,
                    timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.items):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}; got {self.items}")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue


def story(items: list[Any]) -> list[Any]:
    """The partials and verdicts a follower got (consecutive partials of one attempt
    joined: how many writes a draft took depends on timing), then the outcome."""
    told: list[Any] = []
    for item in items:
        if isinstance(item, Partial):
            if told and isinstance(told[-1], tuple) and told[-1][:2] == ("partial", item.attempt):
                told[-1] = ("partial", item.attempt, told[-1][2] + item.text)
            else:
                told.append(("partial", item.attempt, item.text))
        elif isinstance(item, Verdict):
            told.append(("verdict", item.attempt, item.passed, item.reasons))
        elif item.get("stream") == "answer":
            told.append(("outcome", item["data"]))
    return told


EXPECTED = [("partial", 1, "draft 1: the end"), ("verdict", 1, False, REASONS),
            ("partial", 2, "draft 2: the end"), ("verdict", 2, True, []),
            ("outcome", "draft 2: the end")]


class EventSource:
    """Reads a run's event stream the way a browser's ``EventSource`` does: events by
    blank lines, ``id:`` kept as the last event id (also across events without one),
    reconnecting with ``Last-Event-ID`` when the connection ends, until a 204."""

    def __init__(self, base: str, run_id: str) -> None:
        self.url = f"{base}/v1/runs/{run_id}/events"
        self.last_id = ""
        self.seen = Seen()
        self.connections = 0
        self.drop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=60)) as http:
            while True:
                headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
                self.connections += 1
                async with http.stream("GET", self.url, headers=headers) as response:
                    if response.status_code == 204:
                        return
                    assert response.status_code == 200, await response.aread()
                    await self._read(response)

    async def _read(self, response: httpx.Response) -> None:
        lines = response.aiter_lines().__aiter__()
        kind, data = "message", ""
        while True:
            line = await _next_line(lines, self.drop)
            if line is None:  # the connection ended (or the test dropped it): reconnect
                self.drop.clear()
                return
            if line == "":
                if data:
                    self.seen.add((kind, json.loads(data)))
                kind, data = "message", ""
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                self.last_id = value
            elif name == "event":
                kind = value
            elif name == "data":
                data = value


async def _next_line(lines: AsyncIterator[str], drop: asyncio.Event) -> str | None:
    """The next line, or None once the stream ends or ``drop`` is set first."""
    reading = asyncio.ensure_future(lines.__anext__())
    dropping = asyncio.ensure_future(drop.wait())
    done, _ = await asyncio.wait({reading, dropping}, return_when=asyncio.FIRST_COMPLETED)
    dropping.cancel()
    if reading in done:
        try:
            return reading.result()
        except StopAsyncIteration:
            return None
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    return None


def sse_story(events: list[tuple[str, Any]]) -> list[Any]:
    """:func:`story` of the event stream's events."""
    items: list[Any] = []
    for kind, data in events:
        if kind == "partial":
            items.append(Partial("", data["step"], data["attempt"], data["text"]))
        elif kind == "verdict":
            items.append(Verdict("", data["step"], data["attempt"], data["passed"],
                                 data["reasons"]))
        else:
            items.append(data)
    return story(items)


def has_partial(attempt: int) -> Callable[[list[Any]], bool]:
    def check(items: list[Any]) -> bool:
        return any(isinstance(i, Partial) and i.attempt == attempt for i in items)
    return check


def sse_has_partial(attempt: int) -> Callable[[list[Any]], bool]:
    def check(events: list[Any]) -> bool:
        return any(kind == "partial" and data["attempt"] == attempt for kind, data in events)
    return check


async def watching(client: Client, run_id: str, seen: Seen) -> None:
    async for item in client.watch(run_id, timeout=60):
        seen.add(item)


async def test_followers_see_drafts_retracted_then_committed_and_the_outcome(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "streamapp.py").write_text(STREAM_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    prefix = unique_prefix("stream")
    gates = f"{prefix}:test-gates"
    monkeypatch.setenv("STREAM_GATES", gates)  # the app is imported here too (the Client)
    monkeypatch.setenv("STREAM_REDIS", redis_url)
    service = spawn(["--redis-url", redis_url, "--stream-prefix", prefix,
                     "--app", "streamapp:pipeline"],
                    env={"STREAM_GATES": gates, "STREAM_REDIS": redis_url}, cwd=tmp_path)
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert service.http_base is not None
        async with httpx.AsyncClient(base_url=service.http_base, timeout=10) as http:
            answer = await http.post("/v1/runs", json={"data": {"question": "why?"},
                                                        "event_type": "request"})
        assert answer.status_code == 202, answer.text
        run_id = answer.json()["run_id"]
        async with Client(redis_url, stream_prefix=prefix, app="streamapp:pipeline") as client:
            first = Seen()
            watcher = asyncio.create_task(watching(client, run_id, first))
            source = EventSource(service.http_base, run_id)
            sse = asyncio.create_task(source.run())
            # Attempt 1 shows its first chunk and holds: every follower has it, live,
            # and no verdict yet.
            await first.until(has_partial(1), "attempt 1's first chunk by watch")
            await source.seen.until(sse_has_partial(1), "attempt 1's first chunk by SSE")
            assert not any(isinstance(i, Verdict) for i in first.items)
            await r.rpush(f"{gates}:{run_id}:1", "go")
            await first.until(has_partial(2), "attempt 2's first chunk")
            await source.seen.until(sse_has_partial(2), "attempt 2's first chunk by SSE")
            # The event stream's connection ends mid-attempt: the EventSource reconnects
            # with its last event id.
            source.drop.set()
            late = Seen()
            async with Client(redis_url, stream_prefix=prefix,
                              app="streamapp:pipeline") as latecomer:
                late_watcher = asyncio.create_task(watching(latecomer, run_id, late))
                await late.until(has_partial(2), "the late follower's draft in progress")
                await r.rpush(f"{gates}:{run_id}:2", "go")
                await asyncio.wait_for(late_watcher, 30)
            await asyncio.wait_for(watcher, 30)
            await asyncio.wait_for(sse, 30)
            trace = await client.entries(run_id)
    finally:
        await r.aclose()
        service.stop()
    assert story(first.items) == EXPECTED
    # The late follower: attempt 2 from its start, nothing of attempt 1's draft.
    assert story(late.items) == EXPECTED[2:]
    # The event stream, across its reconnect: every committed entry once, in order, and
    # the same story (attempt 2's draft given again from its start after the reconnect).
    assert source.connections == 3  # the first, the reconnect, the 204 after the outcome
    entries = [data for kind, data in source.seen.items if kind == "message"]
    outcome_at = next(n for n, e in enumerate(trace) if e["stream"] == "answer")
    assert [e["id"] for e in entries] == [e["id"] for e in trace[: outcome_at + 1]]
    told = sse_story(source.seen.items)
    assert told[:2] == EXPECTED[:2] and told[-2:] == EXPECTED[-2:]
    assert all(t[0] == "partial" and t[1] == 2 for t in told[2:-2])
    # Partials are no entries of the run.
    assert {e["stream"] for e in trace} == {"request", "draft:loop", "answer"}


async def test_a_draft_left_open_by_a_killed_process_is_retracted_by_the_next_delivery(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process running attempt 1 is killed (-9) after its first chunk: it never
    writes a verdict. Another process takes the entry over once its lease lapses; its
    first partial is preceded by a restart mark, which followers take for the
    retraction of the draft left open (reason ``redelivered``), and attempt 1 streams
    anew."""
    (tmp_path / "streamapp.py").write_text(STREAM_APP)
    (tmp_path / "fast.toml").write_text("[transport]\nvisibility_timeout = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prefix = unique_prefix("stream-kill")
    gates = f"{prefix}:test-gates"
    monkeypatch.setenv("STREAM_GATES", gates)
    monkeypatch.setenv("STREAM_REDIS", redis_url)
    args = ["--redis-url", redis_url, "--stream-prefix", prefix, "--app", "streamapp:pipeline",
            "--config", str(tmp_path / "fast.toml"), "--worker", "draft"]
    env = {"STREAM_GATES": gates, "STREAM_REDIS": redis_url}
    first = spawn(args, env=env, cwd=tmp_path, http=False)
    second = None
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with Client(redis_url, stream_prefix=prefix, app="streamapp:pipeline") as client:
            run_id = await client.submit({"question": "why?"}, event_type="request")
            seen = Seen()
            watcher = asyncio.create_task(watching(client, run_id, seen))
            await seen.until(has_partial(1), "attempt 1's first chunk")
            first.kill()
            second = spawn(args, env=env, cwd=tmp_path, http=False)

            def retracted(items: list[Any]) -> bool:
                return any(isinstance(i, Verdict) for i in items)

            await seen.until(retracted, "the retraction of the draft left open")
            await r.rpush(f"{gates}:{run_id}:1", "go")
            await seen.until(has_partial(2), "attempt 2's first chunk")
            await r.rpush(f"{gates}:{run_id}:2", "go")
            await asyncio.wait_for(watcher, 30)
    finally:
        await r.aclose()
        if second is not None:
            second.stop()
        first.kill()
    lost = [{"code": "redelivered", "field": "",
             "message": "an earlier delivery ended without a verdict (its process stopped)"}]
    assert story(seen.items) == [("partial", 1, "draft 1: "), ("verdict", 1, False, lost),
                                 *EXPECTED]
