"""Budget reviews (docs/reference.md, Budgets; Failures) on a real server: one decision
per breach, however many entries and steps the run held (an approval raises the limit once
and releases every held entry, a rejection ends the run once and asks nothing more), and a
review held at a loop resumes the loop where it was held."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    Budget,
    Client,
    ConsumerSettings,
    Loop,
    Message,
    Output,
    Pipeline,
    Reason,
)
from printery.inbox import reviews
from printery.rules.budgets import held_type
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys, partition_of
from support.spine import pipeline_starter, running_pipeline

Start = Callable[[Pipeline], Awaitable[Client]]


@pytest.fixture
async def start(server: ServerProcess, client: aioredis.Redis, prefix: str) -> AsyncIterator[Start]:
    """Start ``pipeline``'s workers in this process; yields a submitting client."""
    async with pipeline_starter(server.url, client, prefix, max_deliveries=3) as start:
        yield start


# -- one decision per breach --------------------------------------------------------------------


def two_steps() -> Pipeline:
    """``work`` spends 1 usd per job, ``audit`` nothing: both read every job of a run."""
    pipeline = Pipeline("jobs", ingress=["job"], cost_units=["usd"], correlation_field="run_id",
                        budget=Budget(usd=3, on_exceeded="review"), outcomes=())

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["usd"])
    async def work(message: Message) -> Output:
        message.report_cost("usd", 1)
        n = message.data["n"]
        return Output("done", {"n": n}, idempotency_key=f"done:{n}")

    @pipeline.step("audit", consumes=["job"], produces=["audited"])
    async def audit(message: Message) -> Output:
        n = message.data["n"]
        return Output("audited", {"n": n}, idempotency_key=f"audited:{n}")

    return pipeline


async def _submit(client: aioredis.Redis, keys: StreamKeys, run: str, *ns: int) -> None:
    for n in ns:
        await client.xadd(keys.stream("job"), {"data": json.dumps({"n": n}), "run_id": run,
                                               "idempotency_key": f"job:{run}:{n}"})


async def _settled(client: aioredis.Redis, stream: str) -> bool:
    """Every entry of ``stream`` delivered to each of its groups and acknowledged."""
    last = (await client.xinfo_stream(stream))["last-generated-id"]
    groups = await client.xinfo_groups(stream)
    return bool(groups) and all(
        g["pending"] == 0 and g["last-delivered-id"] == last for g in groups)


async def _ns(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> list[int]:
    return sorted(json.loads(f["data"])["n"] for _, f in await client.xrange(keys.stream(event_type)))


async def test_one_review_per_breach_whatever_it_held_and_one_raise_on_approval(
    start: Start, client: aioredis.Redis, prefix: str
) -> None:
    keys, run = StreamKeys(prefix), "run-a"
    pipeline = two_steps()
    await start(pipeline)
    for n in range(3):  # one at a time: the run reaches its limit (3 usd) exactly
        await _submit(client, keys, run, n)
        await wait_for(lambda: _settled(client, keys.stream("job")), message="job settled")
    await _submit(client, keys, run, 3, 4)  # held: 2 jobs x 2 steps
    held = keys.stream(held_type(run))
    await wait_for(lambda: _settled(client, keys.stream("job")), message="jobs held")
    assert await client.xlen(held) == 4
    (review,) = await reviews.list_reviews(client, keys, pipeline)  # one, not four
    assert review["kind"] == "budget_exceeded" and review["run_id"] == run

    decided = await reviews.approve(client, keys, pipeline, review["id"], by="ops")
    assert decided["decision"] == "approved"
    await wait_for(lambda: _settled(client, keys.stream("job")), message="released jobs ran")
    assert await _ns(client, keys, "done") == [0, 1, 2, 3, 4]
    assert await _ns(client, keys, "audited") == [0, 1, 2, 3, 4]
    budget = await client.hgetall(keys.budget(run))
    assert decode_spent(budget["raise:usd"]) == 3  # raised once: the limit is 6, not 9
    assert decode_spent(budget["usd"]) == 5
    assert not await client.exists(held)
    assert await reviews.list_reviews(client, keys, pipeline) == []
    # Each released job ran once per step, and only in that step.
    assert await client.xlen(keys.stream("done")) == 5
    assert await client.xlen(keys.stream("audited")) == 5

    # The next breach (of the raised limit) asks again; a rejection ends the run once and
    # nothing held after it asks again.
    await _submit(client, keys, run, 5)
    await wait_for(lambda: _settled(client, keys.stream("job")), message="job 5")
    await _submit(client, keys, run, 6)
    await wait_for(lambda: _settled(client, keys.stream("job")), message="job 6 held")
    (review,) = await reviews.list_reviews(client, keys, pipeline)
    await reviews.reject(client, keys, pipeline, review["id"], by="ops", note="enough")
    await _submit(client, keys, run, 7)
    await wait_for(lambda: _settled(client, keys.stream("job")), message="job 7 held")
    assert await reviews.list_reviews(client, keys, pipeline) == []
    ((_, exceeded),) = await client.xrange(keys.stream("budget:exceeded"))
    assert json.loads(exceeded["data"])["limit"] == 6
    assert await _ns(client, keys, "done") == [0, 1, 2, 3, 4, 5]
    assert await client.pttl(held) > 0  # held after it: kept while the run's budget lives


# -- a budget review held at a loop ---------------------------------------------------------------


async def test_approving_a_budget_review_held_at_a_loop_resumes_the_loop(
    start: Start, client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    calls: list[int] = []

    async def work(message: Message) -> dict[str, Any]:
        calls.append(message.attempt)
        message.report_cost("tokens", 10)
        return {"text": f"draft {message.attempt}"}

    def validate(message: Message) -> list[Reason]:
        if message.data["text"] == "draft 4":
            return []
        return [Reason("not_yet", "text")]

    pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens"],
                        budget=Budget(tokens=25, on_exceeded="review"))
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=validate, max_attempts=5, cost_units=["tokens"]))
    submitter = await start(pipeline)
    run_id = await submitter.submit({"question": "q"})

    async def open_review() -> dict[str, Any] | None:
        found = await reviews.list_reviews(client, keys, pipeline)
        return found[0] if found else None

    review = await wait_for(open_review, timeout=20, message="the budget review")
    assert review is not None
    # Attempt 3 took the run to 30 tokens: its entry (to be validated) was held.
    assert review["resume_type"] == "draft:attempt" and calls == [1, 2, 3]
    await reviews.approve(client, keys, pipeline, review["id"], by="ops")
    result = await submitter.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "draft 4"}
    assert calls == [1, 2, 3, 4]  # resumed where it was held: no attempt repeated
    trace = await submitter.entries(run_id)
    verdicts = [e["data"]["attempt"] for e in trace if e["type"] == "draft:verdict"]
    assert verdicts == [1, 2, 3, 4]
    assert not await client.exists(keys.stream("draft:attempt"))  # nothing was written there


async def test_a_budget_review_of_an_earlier_version_puts_back_the_entry_it_shows(
    client: aioredis.Redis, prefix: str
) -> None:
    """Written before held streams (no ``budget_held_in``), it held one entry: the one it
    shows, which goes back to the stream it came from with its own type."""
    keys = StreamKeys(prefix)
    pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens"],
                        budget=Budget(tokens=25, on_exceeded="review"))
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=lambda m: None,
                      validate=lambda m: [], max_attempts=2, cost_units=["tokens"]))
    await client.xadd(keys.review, {
        "data": json.dumps({"attempt": 1}), "type": "review", "correlation_id": "run-old",
        "kind": "budget_exceeded", "step": "draft", "reason": "run budget reached",
        "source_stream": keys.stream("draft:loop"), "source_id": "1-0",
        "resume_type": "draft:attempt", "reject_type": "budget:exceeded",
        "budget_unit": "tokens", "budget_field": "tokens", "budget_limit": "25.0",
        "budget_spent": "30.0", "budget_raise": "25.0",
        "held_idempotency_key": "draft:attempt:run-old:1"})
    (review,) = await reviews.list_reviews(client, keys, pipeline)
    await reviews.approve(client, keys, pipeline, review["id"], by="ops")
    ((_, back),) = await client.xrange(keys.stream("draft:loop"))
    assert back["type"] == "draft:attempt" and back["replay_for"] == "draft"
    assert json.loads(back["data"]) == {"attempt": 1} and back["correlation_id"] == "run-old"
    raised = await client.hget(keys.budget("run-old"), "raise:tokens")
    assert decode_spent(raised) == 25


async def test_a_breach_is_held_and_released_in_its_runs_partition(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix, partitions=3)
    run = next(f"run-{n}" for n in range(100) if partition_of(f"run-{n}", 3) == 2)
    part = keys.of(run)
    pipeline = two_steps()
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        for n in range(3):
            await _submit(client, part, run, n)
            await wait_for(lambda: _settled(client, part.stream("job")), message="job settled")
        await _submit(client, part, run, 3)
        await wait_for(lambda: _settled(client, part.stream("job")), message="job held")
        assert await client.xlen(part.stream(held_type(run))) == 2
        (review,) = await reviews.list_reviews(client, keys, pipeline)
        assert review["id"].endswith("@p2")
        await reviews.approve(client, keys, pipeline, review["id"], by="ops")
        await wait_for(lambda: _settled(client, part.stream("job")), message="released")
        assert await _ns(client, part, "done") == [0, 1, 2, 3]
        assert await _ns(client, part, "audited") == [0, 1, 2, 3]
        assert not await client.exists(part.stream(held_type(run)))
