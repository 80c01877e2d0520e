"""User functions called on an entry fail that entry only (reference: failures): a
``Limit`` key function, an ``estimate``, a ``Map``'s ``split`` and a step's ``falls_back``
that raise, on a real server with the workers in this process. Never the worker (it is
not restarted), never the other entries of the batch. A ``Loop``'s (and a ``Map``'s
Loop's) key function sees the loop's input on every turn; an entry whose run id breaks
the rule of run ids is dead-lettered ``invalid_run_id`` before any handler sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    Budget,
    Limit,
    Loop,
    Map,
    Message,
    Output,
    Pipeline,
    Reason,
    StreamKeys,
)
from printery.pipeline.step import Step
from printery.runtime.consumer import ConsumerSettings
from printery.servers.process import ServerProcess
from printery.supervisor.manager import WorkerManager
from printery.testing import wait_for
from support.spine import pipeline_starter, running_pipeline

MAX_DELIVERIES = 3


def settings() -> ConsumerSettings:
    return ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=10,
                            claim_interval=0.1, max_deliveries=MAX_DELIVERIES, concurrency=10)


async def write_raw(client: aioredis.Redis, keys: StreamKeys, event_type: str,
                    entries: list[dict[str, str]]) -> None:
    """Entries as a producer that knows nothing of printery XADDs them, in one
    transaction (a reader starting later gets them in one batch)."""
    pipe = client.pipeline(transaction=True)
    for fields in entries:
        pipe.xadd(keys.stream(event_type), fields)
    await pipe.execute()


def job(n: int, run: str, **data: Any) -> dict[str, str]:
    return {"data": json.dumps({"n": n, **data}), "correlation_id": run}


async def dead_letters(client: aioredis.Redis, keys: StreamKeys) -> dict[str, dict[str, str]]:
    """The dlq's entries by run id."""
    return {fields["correlation_id"]: fields for _, fields in await client.xrange(keys.dlq)}


async def ns_of(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> list[int]:
    return sorted(json.loads(fields["data"])["n"]
                  for _, fields in await client.xrange(keys.stream(event_type)))


def never_restarted(manager: WorkerManager, *workers: str) -> None:
    status = manager.get_status()
    for name in workers:
        assert status[name]["state"] == "running" and status[name]["healthy"], status[name]
        assert status[name]["restarts"] == 0, status[name]


async def test_a_raising_limit_key_dead_letters_its_entry_alone_and_the_worker_stays_up(
    client: aioredis.Redis, prefix: str
) -> None:
    """The README's ``Limit(lambda m: m.data["tenant"])`` and one garbage XADD without a
    tenant (and one whose tenant is no string), read in one batch with five innocent
    entries: those two are dead-lettered ``invalid_limit_key``, the five run."""
    keys = StreamKeys(prefix)
    pipeline = Pipeline("t", ingress=["job"], outcomes=("done",))

    @pipeline.step("work", consumes=["job"], produces=["done"],
                   limits=[Limit(lambda m: m.data["tenant"], concurrency=2)])
    async def work(message: Message) -> Output:
        return Output("done", message.data)

    await write_raw(client, keys, "job", [
        *(job(n, f"ok-{n}", tenant=f"t{n % 2}") for n in range(3)),
        job(3, "no-tenant"), job(4, "int-tenant", tenant=5),
        *(job(n, f"ok-{n}", tenant=f"t{n % 2}") for n in range(5, 7))])
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=settings()) as manager:
        await wait_for(lambda: _count(client, keys.stream("done"), 5), timeout=20,
                       message="the five innocent entries done")
        await wait_for(lambda: _count(client, keys.dlq, 2), timeout=20, message="two dead letters")
        letters = await dead_letters(client, keys)
        assert sorted(letters) == ["int-tenant", "no-tenant"]
        assert {f["reason_code"] for f in letters.values()} == {"invalid_limit_key"}
        assert "KeyError: 'tenant'" in letters["no-tenant"]["error"]
        assert "returned 5" in letters["int-tenant"]["error"]
        assert await ns_of(client, keys, "done") == [0, 1, 2, 5, 6]
        never_restarted(manager, "work")


async def _async(value: bool) -> bool:
    return value


async def _count(client: aioredis.Redis, stream: str, n: int) -> bool:
    return int(await client.xlen(stream)) >= n


@pytest.fixture
async def running(server: ServerProcess, client: aioredis.Redis, prefix: str
                  ) -> AsyncIterator[Any]:
    async with pipeline_starter(server.url, client, prefix, max_deliveries=MAX_DELIVERIES) as start:
        yield start


class Drafts:
    """``work``'s n-th attempt writes ``draft n``; ``validate`` passes ``draft 3`` only."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, Any]] = []

    def tenant(self, message: Message) -> str:
        self.keys.append((message.type, message.data))
        return str(message.data["tenant"])

    async def work(self, message: Message) -> dict[str, Any]:
        return {"text": f"draft {message.attempt}"}

    def validate(self, message: Message) -> list[Reason]:
        if message.data["text"] == "draft 3":
            return []
        return [Reason("not_good_enough", "text", f"{message.data['text']!r} is not it")]


async def test_a_loops_limit_keyed_by_tenant_sees_the_loops_input_on_every_turn(
    running: Any
) -> None:
    """Three attempts with feedback under ``Limit(lambda m: m.data["tenant"])``: every
    call of the key function (the input, each attempt, each verdict) has the loop's input
    as its data, and the run ends with the attempt that passed."""
    drafts = Drafts()
    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=drafts.work,
                      validate=drafts.validate, max_attempts=3,
                      limits=[Limit(drafts.tenant, concurrency=1, name="tenant")]))
    client = await running(pipeline)
    given = {"tenant": "acme", "question": "why?"}
    run_id = await client.submit(given)
    result = await client.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "draft 3"}
    # The input, 3 attempts and 3 verdicts: 7 entries, each keyed once, on the input (the
    # last verdict is handled after the outcome written with it).
    await wait_for(lambda: _async(len(drafts.keys) >= 7), timeout=10, message="7 keys")
    assert len(drafts.keys) == 7
    assert all(seen == ("request", given) for seen in drafts.keys), drafts.keys
    assert await client.redis.xlen(client.keys.dlq) == 0


async def test_a_maps_loop_keys_its_limit_on_the_item(running: Any) -> None:
    """A Loop as a Map's ``each``: its input is the item (what the key function sees on
    every turn), so a tenant carried in the items limits per tenant."""
    drafts = Drafts()
    pipeline = Pipeline("docs", ingress=["document"])
    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda m: [{"tenant": m.data["tenant"], "page": p}
                                      for p in m.data["pages"]],
                     each=Loop("pages:draft", consumes="pages:item", produces="pages:result",
                               work=drafts.work, validate=drafts.validate, max_attempts=3,
                               limits=[Limit(drafts.tenant, concurrency=1)])))
    client = await running(pipeline)
    run_id = await client.submit({"tenant": "acme", "pages": [1, 2]})
    result = await client.result(run_id, timeout=30)
    assert result.status == "merged"
    assert result.data == {"items": [{"text": "draft 3"}] * 2, "failed": []}
    await wait_for(lambda: _async(len(drafts.keys) >= 14), timeout=10, message="14 keys")
    assert len(drafts.keys) == 2 * 7
    assert sorted(data["page"] for _, data in drafts.keys) == [1] * 7 + [2] * 7
    assert {(kind, data["tenant"]) for kind, data in drafts.keys} == {("pages:item", "acme")}


async def test_an_entry_whose_run_id_breaks_the_rule_is_dead_lettered_before_any_handler(
    client: aioredis.Redis, prefix: str
) -> None:
    """A raw XADD with a BEL in its correlation field, one whose data names a run id of
    300 characters: ``invalid_run_id``, no handler call, no run ended under that id; the
    good entry of the same batch runs."""
    keys = StreamKeys(prefix)
    pipeline = Pipeline("t", ingress=["job"], outcomes=("done",))
    seen: list[str] = []

    @pipeline.step("work", consumes=["job"], produces=["done"])
    async def work(message: Message) -> Output:
        seen.append(message.correlation_id)
        return Output("done", message.data)

    long_id = "r" * 300
    await write_raw(client, keys, "job", [
        job(0, "doc\x07bell"), {"data": json.dumps({"n": 1, "correlation_id": long_id})},
        job(2, "fine")])
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=settings()) as manager:
        await wait_for(lambda: _count(client, keys.stream("done"), 1), timeout=20,
                       message="the good entry done")
        await wait_for(lambda: _count(client, keys.dlq, 2), timeout=20, message="two dead letters")
        letters = [fields for _, fields in await client.xrange(keys.dlq)]
        assert [f["reason_code"] for f in letters] == ["invalid_run_id", "invalid_run_id"]
        assert letters[0]["correlation_id"] == "doc\x07bell"  # kept as written: nothing lost
        assert "'doc\\x07bell'" in letters[0]["error"] and "\x07" not in letters[0]["error"]
        assert json.loads(letters[1]["data"])["correlation_id"] == long_id
        assert seen == ["fine"]
        assert await client.xlen(keys.stream("run:failed")) == 0  # no run of such an id
        never_restarted(manager, "work")


async def test_an_estimate_that_raises_anything_dead_letters_invalid_estimate(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    pipeline = Pipeline("t", ingress=["job"], outcomes=("done",), cost_units=["tokens"],
                        budget=Budget(tokens=100_000))

    def estimate(message: Message) -> dict[str, float]:
        if message.data.get("exit"):
            raise SystemExit(3)
        return {"tokens": message.data["tokens"]}

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["tokens"],
                   estimate=estimate)
    async def work(message: Message) -> Output:
        return Output("done", message.data)

    await write_raw(client, keys, "job", [
        job(0, "ok-0", tokens=10), job(1, "no-tokens"), job(2, "exits", exit=True),
        job(3, "ok-3", tokens=10)])
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=settings()) as manager:
        await wait_for(lambda: _count(client, keys.stream("done"), 2), timeout=20,
                       message="the innocent entries done")
        await wait_for(lambda: _count(client, keys.dlq, 2), timeout=20, message="two dead letters")
        letters = await dead_letters(client, keys)
        assert sorted(letters) == ["exits", "no-tokens"]
        assert {f["reason_code"] for f in letters.values()} == {"invalid_estimate"}
        assert "SystemExit: 3" in letters["exits"]["error"]
        assert await ns_of(client, keys, "done") == [0, 3]
        never_restarted(manager, "work")


async def test_a_split_that_raises_fails_its_entry_as_a_handler_would(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    pipeline = Pipeline("docs", ingress=["document"])
    calls: list[int] = []

    def split(message: Message) -> list[Any]:
        calls.append(message.deliveries)
        return list(message.data["pages"])

    pipeline.add(Map("pages", consumes="document", produces="merged", split=split,
                     each=lambda m: m.data))
    await write_raw(client, keys, "document", [
        {"data": json.dumps({"n": 0}), "correlation_id": "no-pages"},
        {"data": json.dumps({"n": 1, "pages": [1, 2]}), "correlation_id": "good"}])
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=settings()) as manager:
        await wait_for(lambda: _count(client, keys.stream("merged"), 1), timeout=20,
                       message="the good document merged")
        await wait_for(lambda: _count(client, keys.dlq, 1), timeout=20, message="a dead letter")
        letter = (await dead_letters(client, keys))["no-pages"]
        assert letter["reason_code"] == "max_deliveries_exceeded"
        assert "KeyError: 'pages'" in letter["error"] and letter["deliveries"] == "3"
        assert sorted(calls) == [1, 1, 2, 3]  # retried as a handler is, then dead-lettered
        never_restarted(manager, "pages", "pages:each", "pages:collect")


async def test_a_falls_back_that_raises_fails_its_entry_as_a_handler_would(
    client: aioredis.Redis, prefix: str
) -> None:
    """A step whose limit has a ``max_wait``: an entry that waits for the slot asks the
    step's ``falls_back`` whether it has a fallback; one for which it raises is retried
    with backoff and dead-lettered with its error, the others wait and run."""
    keys = StreamKeys(prefix)
    pipeline = Pipeline("t", ingress=["job"], outcomes=("done",))
    release = asyncio.Event()

    async def work(message: Message) -> Output:
        if message.data["n"] == 0:
            await release.wait()  # holds the one slot: the others wait for it
        return Output("done", message.data)

    pipeline.add(Step(name="work", consumes=("job",), produces=("done",), handler=work,
                      concurrency=10, limits=[Limit("api", concurrency=1, max_wait=30)],
                      falls_back=lambda m: bool(m.data["fallback"])))
    await write_raw(client, keys, "job", [
        job(0, "first", fallback=False), job(1, "no-answer"),
        *(job(n, f"ok-{n}", fallback=False) for n in range(2, 4))])
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=settings()) as manager:
        await wait_for(lambda: _count(client, keys.dlq, 1), timeout=20, message="a dead letter")
        release.set()
        await wait_for(lambda: _count(client, keys.stream("done"), 3), timeout=20,
                       message="the innocent entries done")
        letter = (await dead_letters(client, keys))["no-answer"]
        assert letter["reason_code"] == "max_deliveries_exceeded"
        assert "falls_back raised KeyError: 'fallback'" in letter["error"]
        assert letter["deliveries"] == str(MAX_DELIVERIES)
        assert await ns_of(client, keys, "done") == [0, 2, 3]
        never_restarted(manager, "work")
