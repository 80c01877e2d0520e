"""Map (reference: fan-out) on a real server, its workers in this process: the output in
item order, each item an entry of the run with its own deliveries, ``skip`` and
``fail``, a Loop as ``each``, zero items, too many items, a split that answers
something else than items, and ``replay --from`` the Map splitting again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    Budget,
    Loop,
    Map,
    Message,
    Pipeline,
    PipelineError,
    Reason,
    ReplayError,
    StreamKeys,
    cost_summary,
    replay,
    to_mermaid,
    to_text,
)
from printery.service.console.graph import item_counts
from printery.testing import wait_for
from support.spine import pipeline_starter


def pages(message: Message) -> list[Any]:
    return list(message.data["pages"])


async def shout(message: Message) -> dict[str, Any]:
    if message.data == "boom":
        raise RuntimeError(f"item {message.envelope.extra['item']} exploded")
    await asyncio.sleep(0)
    return {"text": str(message.data).upper()}


def map_pipeline(**options: Any) -> Pipeline:
    pipeline = Pipeline("docs", ingress=["document"])
    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=options.pop("split", pages), each=options.pop("each", shout),
                     **options))
    return pipeline


@pytest.fixture
async def running(server: Any, client: aioredis.Redis, prefix: str) -> AsyncIterator[Any]:
    """Start ``pipeline``'s workers in this process; yields a submitting client."""
    async with pipeline_starter(server.url, client, prefix, max_deliveries=2) as start:
        yield start


async def test_every_item_is_an_entry_of_the_run_and_the_output_keeps_their_order(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    submitter = await running(map_pipeline(concurrency=4))
    words = [f"page {n}" for n in range(12)]
    run_id = await submitter.submit({"pages": words})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "merged"
    assert result.data == {"items": [{"text": w.upper()} for w in words], "failed": []}
    items = [e for e in result.entries if e["type"] == "pages:item"]
    results = [e for e in result.entries if e["type"] == "pages:result"]
    assert sorted(int(e["item"]) for e in items) == list(range(12))
    assert {e["items"] for e in items} == {"12"}
    assert sorted(int(e["item"]) for e in results) == list(range(12))
    # Each item was handled by the each step as an entry of its own (its own producer
    # and duration), and the output was written once.
    assert {e["producer"] for e in results} == {"pages:each"}
    assert all("duration_ms" in e for e in results)
    assert await client.xlen(f"{prefix}:merged") == 1


async def test_skip_lists_a_failed_item_and_the_rest_go_on(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    submitter = await running(map_pipeline(on_item_failure="skip"))
    run_id = await submitter.submit({"pages": ["a", "boom", "c", "boom"]})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "merged"
    assert result.data == {"items": [{"text": "A"}, None, {"text": "C"}, None], "failed": [1, 3]}
    # The console's run graph counts them on the each step.
    counts = item_counts(map_pipeline(), result.entries)
    assert {step: str(c) for step, c in counts.items()} == {
        "pages:each": "2 done · 2 failed · 0 running"}
    letters = await client.xrange(f"{prefix}:dlq")
    assert sorted(f["item"] for _, f in letters) == ["1", "3"]
    assert {f["reason_code"] for _, f in letters} == {"max_deliveries_exceeded"}
    assert await client.xlen(f"{prefix}:run:failed") == 0


async def test_fail_ends_the_run_failed_naming_the_item(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    submitter = await running(map_pipeline())
    run_id = await submitter.submit({"pages": ["a", "b", "boom"]})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "failed"
    assert result.data["item"] == 2 and result.data["step"] == "pages:each"
    assert "item 2 exploded" in result.data["error"]
    assert await client.xlen(f"{prefix}:merged") == 0


async def test_zero_items_write_the_output_at_once(running: Any, client: aioredis.Redis,
                                                   prefix: str) -> None:
    submitter = await running(map_pipeline())
    run_id = await submitter.submit({"pages": []})
    result = await submitter.result(run_id, timeout=20)
    assert (result.status, result.data) == ("merged", {"items": [], "failed": []})
    assert await client.xlen(f"{prefix}:pages:item") == 0


async def test_merge_decides_the_output(running: Any) -> None:
    submitter = await running(map_pipeline(
        merge=lambda outputs: {"status": "joined", "text": " ".join(o["text"] for o in outputs)}))
    run_id = await submitter.submit({"pages": ["x", "y", "z"]})
    result = await submitter.result(run_id, timeout=20)
    assert (result.status, result.data["text"]) == ("joined", "X Y Z")


@pytest.mark.parametrize(("split", "code", "said"), [
    (lambda m: list(range(6)), "too_many_items", "6 items, more than max_items=5"),
    (lambda m: {"not": "a list"}, "split_not_a_list", "it must return a list"),
    (lambda m: [1, {2, 3}], "item_not_serializable", "item 1"),
])
async def test_a_split_that_cannot_be_fanned_out_fails_the_run(
    running: Any, client: aioredis.Redis, prefix: str, split: Any, code: str, said: str
) -> None:
    submitter = await running(map_pipeline(split=split, max_items=5))
    run_id = await submitter.submit({"pages": []})
    result = await submitter.result(run_id, timeout=20)
    assert (result.status, result.data["reason_code"], result.data["step"]) == (
        "failed", code, "pages")
    assert said in result.data["error"]
    assert await client.xlen(f"{prefix}:pages:item") == 0


def drafting_loop(pass_from: int) -> Loop:
    """A Loop whose item passes at attempt ``pass_from`` (an item "never" never does)."""

    def work(message: Message) -> dict[str, Any]:
        return {"text": message.data, "attempt": message.attempt}

    def validate(message: Message) -> list[Reason]:
        if message.data["text"] != "never" and message.attempt >= pass_from:
            return []
        return [Reason("not_yet", "text", f"attempt {message.attempt}")]

    return Loop("pages:draft", consumes="pages:item", produces="pages:result", work=work,
                validate=validate, max_attempts=3, concurrency=2)


async def test_a_loop_as_each_runs_every_item_to_its_own_verdict(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    submitter = await running(map_pipeline(each=drafting_loop(pass_from=2),
                                           on_item_failure="skip"))
    run_id = await submitter.submit({"pages": ["p0", "never", "p2"]})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "merged"
    assert result.data == {"items": [{"text": "p0", "attempt": 2}, None,
                                     {"text": "p2", "attempt": 2}], "failed": [1]}
    verdicts = [e for e in result.entries if e["type"] == "pages:draft:verdict"]
    # Items 0 and 2 passed at their second attempt, item 1 used all three.
    per_item = sorted((int(e["item"]), e["data"]["attempt"]) for e in verdicts)
    assert per_item == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]


async def test_a_loop_item_exhausted_under_fail_ends_the_run_failed(running: Any) -> None:
    submitter = await running(map_pipeline(each=drafting_loop(pass_from=1)))
    run_id = await submitter.submit({"pages": ["p0", "never"]})
    result = await submitter.result(run_id, timeout=20)
    assert (result.status, result.data["item"], result.data["reason_code"]) == (
        "failed", 1, "item_exhausted")


async def test_replay_from_the_map_splits_again(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    pipeline = map_pipeline()
    submitter = await running(pipeline)
    run_id = await submitter.submit({"pages": ["a", "b"]})
    await submitter.result(run_id, timeout=20)
    replayed = await replay(client, StreamKeys(prefix), pipeline, run_id, from_step="pages")
    assert replayed.reruns == ["pages", "pages:each", "pages:collect"]
    again = await submitter.result(replayed.new_id, timeout=20)
    assert again.data == {"items": [{"text": "A"}, {"text": "B"}], "failed": []}
    assert len([e for e in again.entries if e["type"] == "pages:item"]) == 2


def test_a_map_is_refused_when_it_could_only_fail() -> None:
    with pytest.raises(PipelineError, match="on_item_failure='maybe'"):
        Map("m", consumes="a", produces="b", split=pages, each=shout,
            on_item_failure="maybe")  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="must have consumes='m:item'"):
        Map("m", consumes="a", produces="b", split=pages,
            each=Loop("l", consumes="x", produces="m:result", work=shout,
                      validate=lambda m: [], max_attempts=1))
    with pytest.raises(PipelineError, match="concurrency apply to a handler each"):
        Map("m", consumes="a", produces="b", split=pages, concurrency=3,
            each=Loop("l", consumes="m:item", produces="m:result", work=shout,
                      validate=lambda m: [], max_attempts=1))
    with pytest.raises(PipelineError, match="max_items=-1"):
        Map("m", consumes="a", produces="b", split=pages, each=shout, max_items=-1)
    pipeline = map_pipeline()
    assert [s for s in pipeline.steps] == ["pages", "pages:each", "pages:collect"]
    assert "pages:item" not in pipeline.outcomes and "merged" in pipeline.outcomes
    with pytest.raises(PipelineError, match="declared twice"):
        pipeline.add(Map("pages", consumes="document", produces="other", split=pages,
                         each=shout))


def test_pipeline_show_draws_the_map_as_its_three_steps() -> None:
    pipeline = map_pipeline(on_item_failure="skip", max_items=50)
    text = to_text(pipeline)
    assert "  pages x1: document -> pages:item, merged" in text
    assert ("    map: one pages:item per item (at most 50), each by pages:each, collected by "
            "pages:collect into merged in item order; a failed item: skip (listed in failed, "
            "the rest go on)") in text
    assert "  pages:collect x1: pages:result -> merged" in text
    drawn = to_mermaid(pipeline)
    assert 'pages -->|"pages:item: one per item, at most 50"| pages_each' in drawn
    assert 'pages_collect[/"pages:collect (map: collect)"/]' in drawn
    assert pipeline.describe()["steps"][0]["map"]["each"] == "pages:each"


async def test_items_reserve_their_estimate_so_concurrent_items_cannot_overshoot(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """30 items, 10 at once, each spending 100 tokens, under a run budget of 1,000: each
    reserves its estimate before it runs, so the run stops at the budget, not past it."""

    async def spend(message: Message) -> dict[str, Any]:
        await asyncio.sleep(0.02)  # the items overlap
        message.report_cost("tokens", 100)
        return {"n": message.data}

    pipeline = Pipeline("docs", ingress=["document"], cost_units=["tokens"],
                        budget=Budget(tokens=1000, on_exceeded="stop"))
    pipeline.add(Map("pages", consumes="document", produces="merged", split=pages, each=spend,
                     concurrency=10, estimate={"tokens": 100}, cost_units=["tokens"]))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"pages": list(range(30))})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "budget_exceeded" and result.data["spent"] <= 1000
    stream = f"{prefix}:pages:item"

    async def settled() -> bool:
        return bool((await client.xpending(stream, "pages:each"))["pending"] == 0)

    await wait_for(settled, timeout=20, message="every item settled")
    spent = [json.loads(f["cost"])["tokens"] for _, f in await client.xrange(
        f"{prefix}:pages:result") if "cost" in f]
    # Items held by the stop spent nothing: what was committed stays within the budget.
    assert 0 < len(spent) <= 10 and sum(spent) <= 1000, spent


async def test_replay_from_inside_a_map_is_refused_with_the_step_to_use(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    pipeline = map_pipeline()
    submitter = await running(pipeline)
    run_id = await submitter.submit({"pages": ["a"]})
    await submitter.result(run_id, timeout=20)
    for step in ("pages:each", "pages:collect"):
        with pytest.raises(ReplayError, match="replay --from pages splits again"):
            await replay(client, StreamKeys(prefix), pipeline, run_id, from_step=step)


async def test_every_items_call_is_counted_in_the_runs_cost(
    running: Any, client: aioredis.Redis, prefix: str, server: Any
) -> None:
    """Before (found by a hostile run): calls of one step with the same duration and cost
    were taken for one call writing several outputs, so 30 items reporting a token each
    cost 10. Now the later outputs of one call name its first (``call_of``), and each
    call counts once: the split's items once, every item's call once."""
    def tokens(message: Message) -> dict[str, Any]:
        message.report_cost("tokens", 1)
        return {"n": message.data}

    pipeline = Pipeline("docs", ingress=["document"], cost_units=("tokens",))
    pipeline.add(Map("pages", consumes="document", produces="merged", split=pages,
                     each=tokens, cost_units=("tokens",), concurrency=4))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"pages": list(range(30))})
    result = await submitter.result(run_id, timeout=20)
    assert result.status == "merged" and result.cost == {"tokens": 30}
    items = [e for e in result.entries if e["type"] == "pages:item"]
    assert [e.get("call_of") for e in items[1:]] == [items[0]["event_id"]] * 29
    summary = await cost_summary(client, StreamKeys(prefix), pipeline, run_id)
    assert summary["steps"]["pages"]["calls"] == 1
    assert summary["steps"]["pages:each"]["calls"] == 30
    assert summary["steps"]["pages:each"]["cost"] == {"tokens": 30}
