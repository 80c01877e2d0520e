"""Failures that belong to one entry (docs/reference.md, Failures) on a real server: a
gate (a loop's ``validate``) that answers anything but a list of reasons fails its entry
with ``validator_error`` instead of passing it, and a handler that returns something other
than outputs fails its entry (retried, then dead-lettered) with an error that says what a
handler returns, while its worker goes on with the next entry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    ConsumerSettings,
    Loop,
    Message,
    Output,
    Pipeline,
    Reason,
    WorkerManager,
)
from printery.testing import wait_for
from printery.wire.keys import StreamKeys

Start = Callable[[Pipeline], Awaitable[WorkerManager]]


@pytest.fixture
async def start(client: aioredis.Redis, prefix: str) -> AsyncIterator[Start]:
    managers: list[WorkerManager] = []

    async def run(pipeline: Pipeline) -> WorkerManager:
        manager = WorkerManager(drain_timeout=2)
        settings = ConsumerSettings(block_ms=100, retry_backoff_ms=10, max_deliveries=2)
        for worker, deps in pipeline.build_workers(client=client, keys=StreamKeys(prefix),
                                                   settings=settings):
            manager.register(worker, deps)
        await manager.start_all()
        managers.append(manager)
        return manager

    yield run
    for manager in managers:
        await manager.stop_all(2)


async def _dead_letters(client: aioredis.Redis, keys: StreamKeys, n: int) -> list[dict[str, str]]:
    async def enough() -> list[dict[str, str]] | None:
        found = [fields for _, fields in await client.xrange(keys.dlq)]
        return found if len(found) >= n else None

    found = await wait_for(enough, timeout=20, message=f"{n} dead letters")
    assert found is not None
    return found


# -- a handler that returns the wrong thing ---------------------------------------------------


async def test_a_handler_returning_a_string_fails_its_entry_not_its_worker(
    start: Start, client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("wrong", ingress=["in"])
    calls: list[Any] = []

    @p.step("echo", consumes=["in"], produces=["out"])
    async def echo(message: Message) -> Any:
        calls.append(message.data)
        what = message.data["return"]
        if what == "string":
            return "hello"
        if what == "list":
            return [Output("out", 1), "hello"]
        return Output("out", message.data)

    manager = await start(p)
    for what in ("string", "list", "fine"):
        await client.xadd(keys.stream("in"), {"data": json.dumps({"return": what})})
    letters = await _dead_letters(client, keys, 2)
    await wait_for(lambda: client.xlen(keys.stream("out")), timeout=20, message="the good entry")
    by_kind = {json.loads(d["data"])["return"]: d for d in letters}
    assert by_kind["string"]["reason_code"] == "max_deliveries_exceeded"
    assert by_kind["string"]["deliveries"] == "2"  # retried, like any handler failure
    assert ("a handler returns an Output, a list of Output, or None; it returned 'hello' (str)"
            in by_kind["string"]["error"])
    assert "holding 'hello' (str)" in by_kind["list"]["error"]
    assert calls.count({"return": "string"}) == 2
    assert manager.get_status()["echo"]["state"] == "running"
    (out,) = await client.xrange(keys.stream("out"))
    assert json.loads(out[1]["data"]) == {"return": "fine"}  # only the good entry wrote


# -- gates fail closed ----------------------------------------------------------------------


ANSWERS: dict[str, Any] = {
    "none": None,                                   # a forgotten return
    "string": "fine",
    "dict": {"code": "x"},                          # one mapping, not a list of them
    "int_code": [{"code": 1, "field": None}],       # never coerced to "1" / "None"
    "no_code": [{"field": "text", "message": "?"}],
    "empty_code": [Reason("")],
    "none_field": [{"code": "bad", "field": None}],
    "object": [object()],
}


def _gate_pipeline(validated: list[str]) -> Pipeline:
    p = Pipeline("gates", ingress=["request"])

    async def work(message: Message) -> Any:
        return {"answer": message.data["case"]}

    def validate(message: Message) -> Any:
        case = message.data["answer"]
        validated.append(case)
        if case == "mapping":  # the documented mapping form, proper strings: accepted
            return [{"code": "too_short", "field": "answer", "message": "longer"}]
        if case == "passes":
            return []
        return ANSWERS[case]

    p.add(Loop("draft", consumes="request", produces="answer", work=work, validate=validate,
               max_attempts=1))
    return p


async def test_a_validator_answering_anything_but_reasons_fails_closed(
    start: Start, client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    validated: list[str] = []
    await start(_gate_pipeline(validated))
    cases = [*ANSWERS, "mapping", "passes"]
    for case in cases:
        await client.xadd(keys.stream("request"),
                          {"data": json.dumps({"case": case}), "correlation_id": case})
    letters = await _dead_letters(client, keys, len(ANSWERS))
    await wait_for(lambda: client.xlen(keys.stream("answer")), message="the passing run")
    await wait_for(lambda: client.xlen(keys.stream("draft:exhausted")),
                   message="the run refused with proper reasons")
    failed = {json.loads(d["data"])["data"]["answer"]: d for d in letters}
    assert sorted(failed) == sorted(ANSWERS)
    for case, letter in failed.items():
        assert letter["reason_code"] == "validator_error", case
        assert letter["deliveries"] == "1", case  # at once: it would answer the same again
        assert "validate" in letter["error"], case
    assert "returned None" in failed["none"]["error"]
    assert "'code': 1" in failed["int_code"]["error"]
    # Nothing failed open: only the run whose validator passed wrote the answer.
    answers = [json.loads(f["data"]) for _, f in await client.xrange(keys.stream("answer"))]
    assert answers == [{"answer": "passes"}]
    (exhausted,) = await client.xrange(keys.stream("draft:exhausted"))
    attempts = json.loads(exhausted[1]["data"])["attempts"]
    assert attempts[0]["reasons"] == [{"code": "too_short", "field": "answer",
                                       "message": "longer"}]
    # Each of those runs ended failed (docs/reference.md, Failures), its validator named.
    ended = [json.loads(f["data"]) for _, f in await client.xrange(keys.stream("run:failed"))]
    assert sorted(e["reason_code"] for e in ended) == ["validator_error"] * len(ANSWERS)
