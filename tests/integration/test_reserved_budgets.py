"""Reserved budgets (reference: budgets) against a real server: a step's ``estimate=`` is
reserved before its handler runs, so concurrent siblings cannot together pass a hard
limit; the commit replaces the reservation with what was spent; a reservation whose
handler died lapses; a redelivery does not reserve twice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import Budget, Loop, Message, Output, Pipeline, PipelineError, Reject
from printery.inbox import reviews
from printery.rules.budgets import BudgetPlan, held_type
from printery.runs.cost import budget_status
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Message as HandlerMessage
from printery.runtime.reservations import Reservations, reserved_sums
from printery.testing import wait_for
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys
from support.spine import CODEC, running_pipeline


def settings() -> ConsumerSettings:
    return ConsumerSettings(block_ms=100, visibility_timeout=5.0, retry_backoff_ms=20,
                            claim_interval=0.1, prefetch=50)


async def submit(client: aioredis.Redis, keys: StreamKeys, run: str, n: int) -> None:
    """``n`` entries of one run, in one transaction: a reader gets them together."""
    pipe = client.pipeline(transaction=True)
    for i in range(n):
        envelope = CODEC.new("job", {"n": i}, correlation_id=run, producer="test",
                             idempotency_key=f"job:{run}:{i}")
        pipe.xadd(keys.stream("job"), CODEC.encode(envelope))
    await pipe.execute()


async def spent(client: aioredis.Redis, keys: StreamKeys, run: str, field: str = "tokens") -> float:
    return decode_spent(await client.hget(keys.budget(run), field))


def _pipeline(started: list[int], release: asyncio.Event, **step: Any) -> Pipeline:
    pipeline = Pipeline("r", ingress=["job"], cost_units=["tokens"],
                        budget=Budget(tokens=1000, on_exceeded="stop"), outcomes=())

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["tokens"],
                   concurrency=20, **step)
    async def work(message: Message) -> Output:
        started.append(message.data["n"])
        await release.wait()
        message.report_cost("tokens", 100)
        return Output("done", message.data, idempotency_key=f"done:{message.data['n']}")

    return pipeline


async def test_fifty_siblings_reserve_and_the_run_stops_within_its_limit(
    client: aioredis.Redis, prefix: str
) -> None:
    """50 entries of one run, 20 handlers at once, 100 tokens each against 1,000: ten
    reserve and run, the forty others are held by the budget (the run stops) while the
    ten are still running; spent is then exactly 1,000 and no reservation is left."""
    keys = StreamKeys(prefix)
    started: list[int] = []
    release = asyncio.Event()
    pipeline = _pipeline(started, release, estimate={"tokens": 100})
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 50)

        async def held() -> bool:
            groups = await client.xinfo_groups(keys.stream("job"))
            return (len(started) == 10 and groups[0]["pending"] == 10
                    and groups[0]["entries-read"] == 50)

        await wait_for(held, timeout=15, message="ten running, forty held")
        (exceeded,) = await client.xrange(keys.stream("budget:exceeded"))
        data = CODEC.decode(exceeded[1], "budget:exceeded").data
        assert (data["status"], data["unit"], data["limit"], data["spent"], data["reserved"]) == (
            "budget_exceeded", "tokens", 1000.0, 0.0, 1000.0)
        reserved = await client.hgetall(keys.reserved("run-1"))
        assert len(reserved) == 10
        (row,) = await budget_status(client, keys, pipeline, "run-1") or []
        assert (row["unit"], row["spent"], row["reserved"], row["limit"]) == (
            "tokens", 0.0, 1000.0, 1000.0), "printery cost RUN shows what is reserved"
        release.set()

        async def committed() -> bool:
            return await client.xlen(keys.stream("done")) == 10

        await wait_for(committed, timeout=15, message="ten done")
    assert len(started) == 10
    assert await spent(client, keys, "run-1") == 1000
    assert await client.hgetall(keys.reserved("run-1")) == {}
    (row,) = await budget_status(client, keys, pipeline, "run-1") or []
    assert (row["spent"], row["reserved"], row["status"]) == (1000.0, 0.0, "exceeded")


async def test_without_an_estimate_the_check_lets_siblings_overshoot(
    client: aioredis.Redis, prefix: str
) -> None:
    """The same run without ``estimate=``: the check before handlers sees nothing spent,
    so all twenty handlers start at once and the run overshoots (what reservations fix)."""
    keys = StreamKeys(prefix)
    started: list[int] = []
    release = asyncio.Event()
    pipeline = _pipeline(started, release)
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 50)
        await wait_for(lambda: _now(len(started) == 20), timeout=15, message="20 running")
        release.set()

        async def settled() -> bool:
            groups = await client.xinfo_groups(keys.stream("job"))
            return groups[0]["pending"] == 0 and groups[0]["entries-read"] == 50

        await wait_for(settled, timeout=15, message="all settled")
    assert await spent(client, keys, "run-1") >= 2000


async def _now(value: bool) -> bool:
    return value


def _message(keys: StreamKeys, run: str, key: str) -> HandlerMessage:
    envelope = CODEC.new("job", {}, correlation_id=run, producer="test", idempotency_key=key)
    return HandlerMessage(envelope=envelope, stream=keys.stream("job"), entry_id="1-0",
                          deliveries=1, worker="work", consumer="c", fields={})


async def test_a_redelivery_keeps_its_reservation_and_a_dead_ones_lapses(
    client: aioredis.Redis, prefix: str
) -> None:
    """Limit 200, 100 each: ``a`` reserves; ``a`` again (a redelivery, a claim) finds its
    own reservation and does not count twice, so ``b`` still fits; ``c`` does not, until
    the reservations of ``a`` and ``b`` (whose handlers never commit) lapse."""
    keys = StreamKeys(prefix)
    plan = BudgetPlan("work", ("tokens",), Budget(tokens=200), estimate={"tokens": 100})
    reservations = Reservations(plan, keys=keys, client=client, lease_ms=600)
    a, b, c = (_message(keys, "run-1", key) for key in ("job:a", "job:b", "job:c"))

    async def reserve(*messages: HandlerMessage) -> dict[int, Any]:
        return await reservations.reserve(messages, [reservations.amounts(m) for m in messages])

    assert await reserve(a) == {}
    assert await reserve(a, b) == {}
    (refused,) = (await reserve(c)).values()
    assert (refused.unit, refused.limit, refused.spent, refused.reserved) == (
        "tokens", 200.0, 0.0, 200.0)
    assert sorted(await client.hkeys(keys.reserved("run-1"))) == ["job:a", "job:b"]
    assert reserved_sums(await client.hgetall(keys.reserved("run-1"))) == {"tokens": 200.0}

    async def admitted() -> bool:
        return await reserve(c) == {}

    await wait_for(admitted, timeout=5, message="the dead reservations lapsed")
    assert sorted(await client.hkeys(keys.reserved("run-1"))) == ["job:c"]
    assert reserved_sums({"job:a": "1 tokens 100000000000"}) == {}, "lapsed: counts nothing"


async def test_a_loop_reserves_for_its_work_not_for_judging(
    client: aioredis.Redis, prefix: str
) -> None:
    """A loop with ``estimate=`` reserves before each work call, not before judging an
    attempt: three attempts of 100 under a limit of 350 pass (the last judge, at 300
    spent, would be refused had it reserved 100 too); nothing is left reserved."""
    keys = StreamKeys(prefix)
    seen: list[int] = []

    async def work(message: Message) -> str:
        seen.append(message.attempt)
        message.report_cost("tokens", 100)
        return f"draft {message.attempt}"

    def validate(message: Message) -> list[dict[str, str]]:
        return [] if message.data == "draft 3" else [{"code": "short"}]

    pipeline = Pipeline("r", ingress=["job"], cost_units=["tokens"],
                        budget=Budget(tokens=350, on_exceeded="stop"))
    pipeline.add(Loop("write", consumes="job", produces="done", work=work, validate=validate,
                      max_attempts=3, cost_units=["tokens"], estimate={"tokens": 100}))
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 1)

        async def done() -> bool:
            return await client.xlen(keys.stream("done")) == 1

        await wait_for(done, timeout=15, message="the loop's output")
    assert seen == [1, 2, 3]
    assert await spent(client, keys, "run-1") == 300
    assert await client.hgetall(keys.reserved("run-1")) == {}


async def test_an_estimate_function_that_fails_dead_letters_its_entry_only(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)

    def estimate(message: Message) -> dict[str, float]:
        if message.data["n"] == 1:
            raise ValueError("no estimate for this one")
        return {"tokens": 100}

    started: list[int] = []
    release = asyncio.Event()
    release.set()
    pipeline = _pipeline(started, release, estimate=estimate)
    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 3)

        async def settled() -> bool:
            return (await client.xlen(keys.stream("done")) == 2
                    and await client.xlen(keys.stream("dlq")) == 1)

        await wait_for(settled, timeout=15, message="two done, one dead-lettered")
    (_, dead), = await client.xrange(keys.stream("dlq"))
    assert dead["reason_code"] == "invalid_estimate"
    assert "no estimate for this one" in dead["error"]
    assert sorted(started) == [0, 2]


def test_an_estimate_is_checked_when_the_pipeline_is_defined() -> None:
    pipeline = Pipeline("r", ingress=["job"], cost_units=["tokens"], budget=Budget(tokens=10))
    for wrong, said in (({"usd": 1}, "not a cost unit"), ({"tokens": -1}, "not an amount"),
                        ({}, "not what a call spends"), (5, "not what a call spends")):
        with pytest.raises(PipelineError, match=said):
            pipeline.step("s", consumes=["job"], cost_units=["tokens"], estimate=wrong)(_noop)


async def _noop(message: Message) -> None:
    return None


async def test_a_dead_lettered_entry_gives_its_reservation_back_at_once(
    client: aioredis.Redis, prefix: str
) -> None:
    """Limit 200, 100 each: the first entry is refused by its handler (dead-lettered);
    its reservation goes with its dead letter, so the next two both fit (had it stayed
    until it lapsed, the third would stop the run)."""
    keys = StreamKeys(prefix)
    pipeline = Pipeline("r", ingress=["job"], cost_units=["tokens"],
                        budget=Budget(tokens=200, on_exceeded="stop"), outcomes=())

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["tokens"],
                   estimate={"tokens": 100})
    async def work(message: Message) -> Output:
        if message.data["n"] == 0:
            raise Reject("unreadable")
        message.report_cost("tokens", 100)
        return Output("done", message.data, idempotency_key=f"done:{message.data['n']}")

    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 1)

        async def dead() -> bool:
            return await client.xlen(keys.stream("dlq")) == 1

        await wait_for(dead, timeout=15, message="the first entry dead-lettered")
        assert await client.hgetall(keys.reserved("run-1")) == {}
        pipe = client.pipeline(transaction=True)
        for i in (1, 2):
            envelope = CODEC.new("job", {"n": i}, correlation_id="run-1", producer="test",
                                 idempotency_key=f"job:run-1:{i}")
            pipe.xadd(keys.stream("job"), CODEC.encode(envelope))
        await pipe.execute()

        async def done() -> bool:
            return await client.xlen(keys.stream("done")) == 2

        await wait_for(done, timeout=15, message="both others done")
    assert await client.xlen(keys.stream("budget:exceeded")) == 0
    assert await spent(client, keys, "run-1") == 200


async def test_a_refused_reservation_under_review_asks_once_and_approval_runs_the_held(
    client: aioredis.Redis, prefix: str
) -> None:
    """``on_exceeded="review"``, limit 200, 100 each, four entries at once: two reserve and
    run, the two refused are held with one review between them (not one each); its
    approval raises the limit once (to 400) and the held two reserve and run beside the
    first two: four done, spent 400."""
    keys = StreamKeys(prefix)
    started: list[int] = []
    release = asyncio.Event()
    pipeline = Pipeline("r", ingress=["job"], cost_units=["tokens"],
                        budget=Budget(tokens=200, on_exceeded="review"), outcomes=())

    @pipeline.step("work", consumes=["job"], produces=["done"], cost_units=["tokens"],
                   concurrency=4, estimate={"tokens": 100})
    async def work(message: Message) -> Output:
        started.append(message.data["n"])
        await release.wait()
        message.report_cost("tokens", 100)
        return Output("done", message.data, idempotency_key=f"done:{message.data['n']}")

    async with running_pipeline(pipeline, client=client, keys=keys, settings=settings()):
        await submit(client, keys, "run-1", 4)

        async def one_review() -> list[dict[str, Any]]:
            found = await reviews.list_reviews(client, keys, pipeline)
            return found if len(started) == 2 and await client.xlen(
                keys.stream(held_type("run-1"))) == 2 else []

        (review,) = await wait_for(one_review, timeout=15, message="two running, two held")
        assert review["kind"] == "budget_exceeded"
        await reviews.approve(client, keys, pipeline, review["id"], by="ops")
        await wait_for(lambda: _now(len(started) == 4), timeout=15, message="the held two run")
        release.set()

        async def done() -> bool:
            return await client.xlen(keys.stream("done")) == 4

        await wait_for(done, timeout=15, message="four done")
    assert await spent(client, keys, "run-1") == 400
    assert decode_spent(await client.hget(keys.budget("run-1"), "raise:tokens")) == 200
    assert await reviews.list_reviews(client, keys, pipeline) == []
    assert await client.hgetall(keys.reserved("run-1")) == {}
