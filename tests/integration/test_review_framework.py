"""The review inbox's framework functions (``printery.inbox.reviews``, docs/reference.md,
Review inbox) on a real server: escalations carry the types their decisions write, the
pipeline refuses one that does not declare them, decisions are once-only and typed,
deadlines reject by timeout."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from printery import (
    REVIEW,
    Codec,
    Message,
    Output,
    Pipeline,
    PipelineError,
    ReviewActionFailed,
    ReviewCase,
    ReviewInvalid,
    ReviewNotFound,
    ReviewOutcome,
    ReviewRefused,
    Step,
    StreamKeys,
    WorkerManager,
    escalate,
    review_output,
)
from printery.base.errors import OutputContractError
from printery.inbox import reviews
from printery.runs.history import id_order
from printery.testing import wait_for


async def failing(message: Message) -> Output:
    raise RuntimeError("model unavailable")


async def nothing(message: Message) -> None:
    return None


class Answer(BaseModel):
    answer: str


def escalating_pipeline() -> Pipeline:
    p = Pipeline("rev", ingress=["task"])
    p.add(Step("work", ("task",), ("answer", "failed", REVIEW),
               escalate(failing, attempts=1, review_kind="model_failed",
                        on_approve="answer", on_reject="failed")))
    p.add(Step("use", ("answer",), (), nothing, input_model=Answer))
    return p


def test_an_escalation_to_undeclared_types_is_refused_at_build_time() -> None:
    p = Pipeline("rev", ingress=["task"])
    p.add(Step("work", ("task",), ("answer", REVIEW),
               escalate(failing, attempts=1, review_kind="k", on_approve="answer",
                        on_reject="failed")))
    with pytest.raises(PipelineError, match=r"'failed'"):
        p.validate()
    with pytest.raises(ValueError, match="review_kind"):
        escalate(failing, attempts=1, on_approve="answer")
    escalating_pipeline().validate()


async def test_a_review_output_naming_an_undeclared_type_breaks_the_contract() -> None:
    async def unsure(message: Message) -> Output:
        return review_output(message, kind="k", reason="unsure", on_approve="elsewhere")

    step = Step("work", ("task",), ("answer", REVIEW), unsure)
    envelope = Codec().new("task", {"q": 1}, producer="test")
    message = Message(envelope=envelope, stream="p:task", entry_id="1-0", deliveries=1,
                      worker="work", consumer="c", fields={})
    with pytest.raises(OutputContractError, match="elsewhere"):
        await step.guarded_handler()(message)


async def _escalated(client: aioredis.Redis, keys: StreamKeys, p: Pipeline,
                     *cids: str) -> dict[str, str]:
    """Run ``p`` until each of ``cids`` escalated; correlation id -> review id."""
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in p.build_workers(client=client, keys=keys, only=["work"]):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        for cid in cids:
            await client.xadd(keys.stream("task"), {"data": json.dumps({"correlation_id": cid})})

        async def all_escalated() -> dict[str, str]:
            found = {f["correlation_id"]: i for i, f in await client.xrange(keys.review)}
            return found if len(found) == len(cids) else {}

        return await wait_for(all_escalated, timeout=10)
    finally:
        await manager.stop_all(2)


async def _data(client: aioredis.Redis, keys: StreamKeys, event_type: str) -> list[Any]:
    return [json.loads(f["data"]) for _, f in await client.xrange(keys.stream(event_type))]


async def test_decisions_write_the_escalations_types(client: aioredis.Redis, prefix: str) -> None:
    keys, p = StreamKeys(prefix), escalating_pipeline()
    ids = await _escalated(client, keys, p, "c1", "c2", "c3")
    view = await reviews.get_review(client, keys, p, ids["c1"])
    assert (view["resume_type"], view["reject_type"]) == ("answer", "failed")
    assert view["correlation_id"] == "c1" and view["data"] == {"correlation_id": "c1"}

    with pytest.raises(ReviewInvalid) as refused:
        await reviews.approve(client, keys, p, ids["c1"], by="ana", data={"answer": 42})
    assert refused.value.reasons[0]["field"] == "answer", "the resumed step's model says why"
    with pytest.raises(ReviewInvalid):
        await reviews.approve(client, keys, p, ids["c1"], by=" ")
    with pytest.raises(ReviewInvalid):
        await reviews.decide(client, keys, p, ids["c1"], "rejected", by="ana", data={"a": 1})

    record = await reviews.approve(client, keys, p, ids["c1"], by="ana", note="fixed",
                                   data={"answer": "42"})
    assert record["outputs"] == ["answer"] and record["correlation_id"] == "c1"
    (_, answer), = await client.xrange(keys.stream("answer"))
    assert json.loads(answer["data"]) == {"answer": "42"} and answer["correlation_id"] == "c1"
    await reviews.approve(client, keys, p, ids["c2"], by="ana")  # default: the escalated data
    assert (await _data(client, keys, "answer"))[1] == {"correlation_id": "c2"}

    await reviews.reject(client, keys, p, ids["c3"], by="bo", note="no")
    assert await _data(client, keys, "failed") == [{
        "correlation_id": "c3", "status": "rejected", "request": {"correlation_id": "c3"},
        "reasons": [{"code": "rejected_by_reviewer", "field": "", "message": "no"}]}]
    for review_id in [*ids.values(), "1-1", "not-an-id"]:
        with pytest.raises(ReviewNotFound):
            await reviews.reject(client, keys, p, review_id, by="bo")
    assert await reviews.list_reviews(client, keys, p) == []
    assert await client.xlen(keys.review_decided) == 3


async def test_kind_hooks_refuse_or_fail_and_nothing_is_written(
        client: aioredis.Redis, prefix: str) -> None:
    keys, p = StreamKeys(prefix), escalating_pipeline()

    async def only_admins(case: ReviewCase) -> ReviewOutcome:
        if case.by != "admin":
            raise ReviewRefused(f"{case.by} may not approve")
        return ReviewOutcome(detail="ok", result={"extra": 1})

    async def broken(case: ReviewCase) -> ReviewOutcome:
        raise ReviewActionFailed("the action failed; the review stays open")

    p.review_kind("model_failed", approve=only_admins, reject=broken, accepts_data=False)
    ids = await _escalated(client, keys, p, "h1")
    with pytest.raises(ReviewRefused):
        await reviews.approve(client, keys, p, ids["h1"], by="ana")
    with pytest.raises(ReviewActionFailed):
        await reviews.reject(client, keys, p, ids["h1"], by="ana")
    with pytest.raises(ReviewInvalid, match="no edited data"):
        await reviews.approve(client, keys, p, ids["h1"], by="admin", data={"answer": "x"})
    assert await client.xlen(keys.review) == 1 and await client.xlen(keys.review_decided) == 0
    record = await reviews.approve(client, keys, p, ids["h1"], by="admin")
    assert record["extra"] == 1 and record["outputs"] == [] and record["detail"] == "ok"
    # (the stream exists: the pipeline's start placed the groups of every step on it)
    assert await client.xlen(keys.stream("answer")) == 0


async def test_deadlines_reject_by_timeout_once_across_sweepers(
        client: aioredis.Redis, prefix: str) -> None:
    keys, p = StreamKeys(prefix), escalating_pipeline()
    ids = await _escalated(client, keys, p, "t1")
    assert await reviews.expire_reviews(client, keys, p, {"model_failed": 3600}) == []
    assert await reviews.expire_reviews(client, keys, p, {"other_kind": 0.001}) == []
    # Several service processes sweep at once: one decision.
    swept = await asyncio.gather(*(reviews.expire_reviews(client, keys, p, {"model_failed": 0.001})
                                   for _ in range(4)))
    made = [record for records in swept for record in records]
    assert [(r["review_id"], r["by"], r["decision"]) for r in made] == [
        (ids["t1"], "timeout", "rejected")]
    assert (await _data(client, keys, "failed"))[0]["status"] == "rejected"
    assert await client.xlen(keys.review_decided) == 1


@pytest.mark.parametrize("partitions", [1, 3])
async def test_open_reviews_are_listed_a_page_at_a_time_each_once_oldest_first(
    client: aioredis.Redis, prefix: str, partitions: int
) -> None:
    """A listing reads at most a page of each partition's review stream; paging on from
    each page's last id lists every open review exactly once, oldest first, across
    partitions; an ``after`` that is no review id and a limit under 1 are refused."""
    keys = StreamKeys(prefix, partitions)
    pipeline = escalating_pipeline()
    written = []
    for n in range(7):  # alternating partitions, in time order
        part = keys.at(n % partitions)
        entry_id = await client.xadd(part.review, {
            "data": json.dumps({"n": n}), "kind": "model_failed", "step": "work",
            "correlation_id": f"run-{n}", "reason": "r", "resume_type": "answer",
            "reject_type": "failed"})
        written.append(part.entry_ref(entry_id))
    seen: list[str] = []
    after = ""
    pages = 0
    while True:
        page = await reviews.list_reviews(client, keys, pipeline, limit=3, after=after)
        seen += [r["id"] for r in page]
        pages += 1
        if len(page) < 3:
            break
        after = page[-1]["id"]
    # Oldest first: by entry id, then partition (two partitions' streams may give the
    # same id in one millisecond).
    def oldest_first(ref: str) -> tuple[tuple[int, int], str]:
        entry_id, _, part = ref.partition("@")
        return id_order(entry_id), part

    assert seen == sorted(written, key=oldest_first) and pages == 3
    whole = await reviews.list_reviews(client, keys, pipeline, limit=None)
    assert [r["id"] for r in whole] == seen
    assert [r["id"] for r in await reviews.list_reviews(
        client, keys, pipeline, limit=2, after=seen[4])] == seen[5:]
    with pytest.raises(ReviewInvalid):
        await reviews.list_reviews(client, keys, pipeline, after="not-an-id")
    with pytest.raises(ReviewInvalid):
        await reviews.list_reviews(client, keys, pipeline, limit=0)
