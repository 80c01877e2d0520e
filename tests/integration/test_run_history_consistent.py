"""A run's history is read one stream at a time, while its workers go on writing: a
reader that scans the ``answer`` stream just before the step's output lands there, then
finds the run's outcome in a stream it scans after, must not return the outcome without
what led to it. ``RunResult.cost`` (and every reader of the history: ``GET
/v1/runs/{id}``, ``trace``) counts the calls before the outcome (docs/reference.md,
Replay and cost): reading the history again once its outcome is known gives them.

The interleaving is made, not waited for: the scan of the run's streams (printery's own
:func:`~printery.store.scan.scan_stream`, over the real server) has the workers' writes
land just before it reaches the outcome's stream, as they did on CI under load."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import printery.runs.reader as reader_module
from printery import Message, Output, Pipeline, Reject
from printery.runs.reader import RunReader
from printery.testing import unique_prefix
from printery.wire.keys import StreamKeys


def pipeline() -> Pipeline:
    p = Pipeline("history", ingress=["question"], correlation_field="run",
                 cost_units=["tokens"])

    @p.step("ask", consumes=["question"], produces=["answer"], cost_units=["tokens"])
    async def ask(message: Message) -> Output:
        return Output("answer", {})

    @p.step("check", consumes=["answer"], produces=["checked"])
    async def check(message: Message) -> Output:
        raise Reject("never_good", "no answer passes")

    return p


async def test_an_outcome_read_is_never_given_without_the_calls_before_it(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys, p = StreamKeys(unique_prefix("history")), pipeline()
    await client.xadd(keys.stream("question"), {"data": "{}", "run": "r1"})
    real_scan = reader_module.scan_stream
    landed: list[str] = []

    async def scan_while_the_workers_write(redis: Any, stream: str, *args: Any,
                                           **kwargs: Any) -> AsyncIterator[Any]:
        if stream == keys.stream("run:failed") and not landed:
            # ``answer`` was scanned a moment ago, empty; the step's call lands now, and
            # the next step's failure ends the run before the scan gets here.
            landed.append(await client.xadd(keys.stream("answer"), {
                "data": "{}", "run": "r1", "producer": "ask", "duration_ms": "3.5",
                "cost": '{"tokens": 100}'}))
            await client.xadd(keys.stream("run:failed"), {
                "data": '{"status": "failed", "step": "check", "reason_code": "never_good"}', "run": "r1",
                "producer": "check"})
        async for entry in real_scan(redis, stream, *args, **kwargs):
            yield entry

    monkeypatch.setattr(reader_module, "scan_stream", scan_while_the_workers_write)
    result = await RunReader(client, keys, p).result("r1", timeout=5)
    assert landed, "the scan reached the outcome's stream"
    assert [e["stream"] for e in result.entries] == ["question", "answer", "run:failed"]
    assert result.status == "failed" and result.cost == {"tokens": 100}
