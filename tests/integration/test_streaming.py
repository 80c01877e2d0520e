"""Streaming through the gate (reference: streaming through the gate), the producer's
side on a real server: what handlers show with ``message.partial`` (or a Loop's async
generator ``work``, or ``OpenAICompatible(stream=True)`` against a streaming server on
loopback) reaches the run's partials stream while the attempt runs, and the gate's
verdict commits or retracts it; none of it is an entry of the run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from printery import (
    Budget,
    Client,
    ConsumerSettings,
    Loop,
    Map,
    Message,
    Output,
    Partial,
    Pipeline,
    Reason,
    StreamKeys,
    Verdict,
    WorkerManager,
    escalate,
)
from printery.pipeline.models import OpenAICompatible
from printery.runs import tail
from printery.runs.partials import POSITION, Drafts
from printery.testing import unique_prefix, wait_for
from printery.transport.connection import connect
from support.cluster import ValkeyCluster
from support.spine import pipeline_starter
from support.stream_model import StreamModel, serving


@pytest.fixture
async def running(redis_url: str, client: aioredis.Redis, prefix: str) -> AsyncIterator[Any]:
    """Start ``pipeline``'s workers in this process; yields a submitting client."""
    async with pipeline_starter(redis_url, client, prefix, max_deliveries=3) as start:
        yield start


async def shown(client: aioredis.Redis, prefix: str, run_id: str) -> list[dict[str, Any]]:
    """The run's partials stream: each partial as (step, attempt, text), each verdict as
    (step, attempt, passed, reasons); consecutive partials of one attempt joined (how
    many writes the text took depends on timing)."""
    found: list[dict[str, Any]] = []
    for _, fields in await client.xrange(StreamKeys(prefix).of(run_id).partials(run_id)):
        if fields["kind"] == "partial":
            last = found[-1] if found else None
            if (last is not None and "text" in last and last["step"] == fields["step"]
                    and last["attempt"] == int(fields["attempt"])):
                last["text"] += fields["text"]
                continue
            found.append({"step": fields["step"], "attempt": int(fields["attempt"]),
                          "text": fields["text"]})
        elif fields["kind"] == "restart":
            found.append({"step": fields["step"], "attempt": int(fields["attempt"]),
                          "restart": True})
        else:
            found.append({"step": fields["step"], "attempt": int(fields["attempt"]),
                          "passed": fields["passed"] == "1",
                          "reasons": orjson.loads(fields["reasons"])})
    return found


class Streaming:
    """A loop's streaming work: attempt n yields ``draft `` then ``n`` (attempt 1 holds
    before its second chunk until the test lets it go); the validator passes draft 2."""

    def __init__(self) -> None:
        self.go_on = asyncio.Event()

    async def work(self, message: Message) -> AsyncIterator[str]:
        yield "draft "
        if message.attempt == 1:
            await self.go_on.wait()
        yield str(message.attempt)

    def validate(self, message: Message) -> list[Reason]:
        if message.data == "draft 2":
            return []
        return [Reason("not_good_enough", "", f"{message.data!r} is not it")]


async def streaming_loop(running: Any, client: aioredis.Redis, prefix: str) -> tuple[
    Streaming, Client, str, list[dict[str, Any]]
]:
    """A loop of :class:`Streaming` work running, a run submitted, and what it showed
    once its first chunk is on the server (attempt 1 holds until ``go_on``)."""
    work = Streaming()
    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work.work,
                      validate=work.validate, max_attempts=3))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})

    async def first_chunk() -> list[dict[str, Any]]:
        found = await shown(client, prefix, run_id)
        return found if found and found[0].get("text") == "draft " else []

    return work, submitter, run_id, await wait_for(first_chunk, timeout=10)


async def test_a_loop_streams_each_attempt_and_its_verdict_commits_or_retracts_it(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    work, submitter, run_id, first = await streaming_loop(running, client, prefix)
    # Live: the first chunk is on the server while the attempt still runs, no verdict yet.
    assert first == [{"step": "draft", "attempt": 1, "text": "draft "}]
    work.go_on.set()
    result = await submitter.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == "draft 2"
    assert await shown(client, prefix, run_id) == [
        {"step": "draft", "attempt": 1, "text": "draft 1"},
        {"step": "draft", "attempt": 1, "passed": False, "reasons": [
            {"code": "not_good_enough", "field": "", "message": "'draft 1' is not it"}]},
        {"step": "draft", "attempt": 2, "text": "draft 2"},
        {"step": "draft", "attempt": 2, "passed": True, "reasons": []},
    ]
    # Partials are no entries of the run: the trace holds the attempts and verdicts only.
    streams = {entry["stream"] for entry in await submitter.entries(run_id)}
    assert streams == {"request", "draft:loop", "answer"}
    ttl = await client.ttl(StreamKeys(prefix).partials(run_id))
    assert 0 < ttl <= 3600


async def test_an_attempt_whose_entry_another_delivery_took_is_retracted(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """Before (found by ``make chaos``): a delivery that streamed an attempt after
    another delivery had taken its entry (its lease lapsed behind a blocked event loop)
    committed nothing, and its draft was never judged: no verdict for ever. Now its
    draft is retracted as ``redelivered``."""
    work, _, run_id, _ = await streaming_loop(running, client, prefix)
    # Another delivery takes the entry and settles it, as a claim after a lapsed lease.
    stream = StreamKeys(prefix).stream("request")
    [pending] = await client.xpending_range(stream, "draft", "-", "+", 10)
    await client.xclaim(stream, "draft", "elsewhere", 0, [pending["message_id"]])
    await client.xack(stream, "draft", pending["message_id"])
    work.go_on.set()

    async def retracted() -> list[dict[str, Any]]:
        return [v for v in await shown(client, prefix, run_id) if "passed" in v]

    [verdict] = await wait_for(retracted, timeout=10, message="the retraction")
    assert (verdict["attempt"], verdict["passed"]) == (1, False)
    assert [r["code"] for r in verdict["reasons"]] == ["redelivered"]


async def test_a_plain_step_that_fails_retracts_what_it_showed_and_streams_anew(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    pipeline = Pipeline("answers", ingress=["request"])

    @pipeline.step("write", consumes=["request"], produces=["answer"])
    async def write(message: Message) -> Output:
        await message.partial("half ")
        if message.deliveries == 1:
            raise RuntimeError("the model went away")
        await message.partial("and whole")
        return Output("answer", {"text": "half and whole"})

    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    watched = [item async for item in submitter.watch(run_id, timeout=30)]
    assert watched[-1]["data"] == {"text": "half and whole"}
    # The second delivery marks its restart (a draft an earlier delivery left open, its
    # process dead, would be retracted by it); this one had retracted its own already,
    # so followers pass over the mark: one verdict per draft.
    assert await shown(client, prefix, run_id) == [
        {"step": "write", "attempt": 1, "text": "half "},
        {"step": "write", "attempt": 1, "passed": False, "reasons": [
            {"code": "work_failed", "field": "", "message": "RuntimeError: the model went away"}]},
        {"step": "write", "attempt": 1, "restart": True},
        {"step": "write", "attempt": 1, "text": "half and whole"},
        {"step": "write", "attempt": 1, "passed": True, "reasons": []},
    ]
    verdicts = [(v.passed, [r["code"] for r in v.reasons]) for v in watched
                if isinstance(v, Verdict)]
    assert verdicts[-1] == (True, []) and verdicts[:-1] in ([], [(False, ["work_failed"])])


async def test_a_draft_cut_short_by_the_step_timeout_is_retracted_as_timeout(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """Before (found by a hostile run): retracted as ``cancelled`` while its dead letter
    said ``timeout``; the retraction now names the step's timeout."""
    pipeline = Pipeline("answers", ingress=["request"])

    @pipeline.step("write", consumes=["request"], produces=["answer"], timeout=0.3)
    async def write(message: Message) -> Output:
        await message.partial("draft ")
        if message.deliveries == 1:
            await asyncio.sleep(30)
        return Output("answer", {"text": "done"})

    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    assert (await submitter.result(run_id, timeout=30)).data == {"text": "done"}
    [first, *_] = [v for v in await shown(client, prefix, run_id) if "passed" in v]
    assert first["passed"] is False and [r["code"] for r in first["reasons"]] == ["timeout"]


async def test_a_step_that_never_streams_writes_nothing_of_it(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    pipeline = Pipeline("answers", ingress=["request"])

    @pipeline.step("write", consumes=["request"], produces=["answer"])
    async def write(message: Message) -> Output:
        return Output("answer", {"text": "done"})

    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    assert (await submitter.result(run_id, timeout=30)).data == {"text": "done"}
    assert await client.exists(StreamKeys(prefix).partials(run_id)) == 0


async def test_openai_compatible_streams_the_chunks_and_charges_the_final_usage(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    model = StreamModel(hold=True)
    async with serving(model):
        llm = OpenAICompatible(model.url, "tiny-1", api_key_env=None,
                               prices={"input": 1.0, "output": 2.0})
        pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens", "usd"])

        @pipeline.step("ask", consumes=["request"], produces=["answer"],
                       cost_units=["tokens", "usd"])
        async def ask(message: Message) -> Output:
            done = await llm.complete(message, messages=[{"role": "user", "content": "?"}],
                                      stream=True, temperature=0)
            return Output("answer", {"text": done.text, "tokens": done.tokens})

        submitter = await running(pipeline)
        run_id = await submitter.submit({"question": "why?"})

        async def before_the_last_chunk() -> list[dict[str, Any]]:
            found = await shown(client, prefix, run_id)
            return found if found and found[0]["text"] == "The answer is " else []

        await asyncio.wait_for(model.holding.wait(), 10)
        assert await wait_for(before_the_last_chunk, timeout=10) == [
            {"step": "ask", "attempt": 1, "text": "The answer is "}]
        model.release()
        result = await submitter.result(run_id, timeout=30)
    assert result.data == {"text": "The answer is 42.", "tokens": 11}
    assert result.cost == {"tokens": 11, "usd": (7 * 1.0 + 4 * 2.0) / 1000}
    assert await shown(client, prefix, run_id) == [
        {"step": "ask", "attempt": 1, "text": "The answer is 42."},
        {"step": "ask", "attempt": 1, "passed": True, "reasons": []},
    ]
    (body,) = model.requests
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["model"] == "tiny-1"


async def test_a_follower_joining_a_read_under_way_gets_the_verdict_before_the_outcome(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """Another run's follower keeps the partition's read going; this run's follower
    joins it after the draft was shown, and the run ends before the read's next turn
    takes up the run's partials: the verdict still comes first, then the outcome."""
    gates: dict[str, asyncio.Event] = {"other": asyncio.Event(), "this": asyncio.Event()}
    pipeline = Pipeline("answers", ingress=["request"])

    @pipeline.step("write", consumes=["request"], produces=["answer"], concurrency=2)
    async def write(message: Message) -> Output:
        await message.partial(f"{message.data['name']} draft")
        await gates[message.data["name"]].wait()
        return Output("answer", {"text": "done"})

    submitter = await running(pipeline)
    other = await submitter.submit({"name": "other"})
    other_items: list[Any] = []

    async def keep_reading() -> None:
        async for item in submitter.watch(other, timeout=30):
            other_items.append(item)

    reading = asyncio.create_task(keep_reading())
    await wait_for(lambda: _has(other_items, "other draft"), timeout=10)
    run_id = await submitter.submit({"name": "this"})
    await wait_for(lambda: _shown_text(client, prefix, run_id, "this draft"), timeout=10)
    items: list[Any] = []

    async def follow() -> None:
        async for item in submitter.watch(run_id, timeout=30):
            items.append(item)
            if isinstance(item, Partial):
                gates["this"].set()  # ends the run while the read's block goes on

    await asyncio.wait_for(follow(), 30)
    gates["other"].set()
    await asyncio.wait_for(reading, 30)
    kinds = [type(i).__name__ if not isinstance(i, dict) else i["stream"] for i in items]
    assert kinds == ["request", "Partial", "Verdict", "answer"], items
    assert items[2] == Verdict(run_id, "write", 1, True, [])


async def _has(items: list[Any], text: str) -> bool:
    return any(isinstance(i, Partial) and i.text == text for i in items)


async def _shown_text(client: aioredis.Redis, prefix: str, run_id: str, text: str) -> bool:
    return any(s.get("text") == text for s in await shown(client, prefix, run_id))


async def test_a_gate_that_fails_closed_retracts_the_attempt(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """A validator that answers no list of reasons fails the entry (validator_error):
    what the attempt showed is retracted with that reason, never left provisional."""
    async def work(message: Message) -> AsyncIterator[str]:
        yield "a draft"

    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=lambda message: None, max_attempts=2))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    assert (await submitter.result(run_id, timeout=30)).status == "failed"
    found = await shown(client, prefix, run_id)
    assert found[0] == {"step": "draft", "attempt": 1, "text": "a draft"}
    assert found[1]["passed"] is False and len(found) == 2
    assert [r["code"] for r in found[1]["reasons"]] == ["validator_error"]


async def test_an_escalated_step_retracts_its_draft_before_the_fallback_streams(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    async def handler(message: Message) -> Output:
        await message.partial("first try")
        raise RuntimeError("the model is down")

    async def fallback(message: Message) -> Output:
        await message.partial("from the fallback")
        return Output("answer", {"text": "from the fallback"})

    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.step("write", consumes=["request"], produces=["answer"])(
        escalate(handler, attempts=1, fallback=fallback))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    assert (await submitter.result(run_id, timeout=30)).data == {"text": "from the fallback"}
    assert await shown(client, prefix, run_id) == [
        {"step": "write", "attempt": 1, "text": "first try"},
        {"step": "write", "attempt": 1, "passed": False, "reasons": [
            {"code": "work_failed", "field": "", "message": "RuntimeError: the model is down"}]},
        {"step": "write", "attempt": 1, "text": "from the fallback"},
        {"step": "write", "attempt": 1, "passed": True, "reasons": []},
    ]


async def test_the_items_of_a_map_stream_drafts_of_their_own(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """Three pages drafted at once by one Loop (a Map's each): each item's partials and
    verdicts name the item, so a follower keeps three drafts apart, each closed by its
    own verdict (page 1's first attempt retracted, the others passed)."""
    async def work(message: Message) -> AsyncIterator[str]:
        yield f"page {message.data} "
        yield f"attempt {message.attempt}"

    def validate(message: Message) -> list[Reason]:
        if message.data == "page 1 attempt 1":
            return [Reason("too_short", "", "page 1 needs another go")]
        return []

    pipeline = Pipeline("docs", ingress=["document"])
    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda message: list(range(3)),
                     each=Loop("pages:draft", consumes="pages:item", produces="pages:result",
                               work=work, validate=validate, max_attempts=2, concurrency=3)))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"document": "three pages"})
    items = [item async for item in submitter.watch(run_id, timeout=30)]
    assert items[-1]["data"]["items"] == ["page 0 attempt 1", "page 1 attempt 2",
                                          "page 2 attempt 1"]
    drafts = Drafts()
    for item in items:
        if isinstance(item, (Partial, Verdict)):
            assert item.item in (0, 1, 2) and item.step == "pages:draft"
            drafts.add(item)
    assert sorted((d.item, d.attempt, d.text, d.state) for d in drafts.drafts) == [
        (0, 1, "page 0 attempt 1", "committed"), (1, 1, "page 1 attempt 1", "retracted"),
        (1, 2, "page 1 attempt 2", "committed"), (2, 1, "page 2 attempt 1", "committed")]


async def test_a_reconnect_gets_what_it_missed_after_its_last_event(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """An event stream that went away mid-attempt and comes back after the run ended
    (its ``Last-Event-ID``'s positions as ``seen``): the rest of the draft, the verdict
    and the entries it missed, up to the outcome; nothing it had, nothing after."""
    work = Streaming()
    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work.work,
                      validate=lambda message: [], max_attempts=1))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    given: list[Any] = []
    async for item in submitter.watch(run_id, timeout=30):
        given.append(item)
        if isinstance(item, Partial):
            break  # the connection goes: attempt 1 holds after its first chunk
    work.go_on.set()
    await submitter.result(run_id, timeout=30)
    seen = {POSITION: given[-1].id, **{e["stream"]: e["id"] for e in given
                                       if isinstance(e, dict)}}
    reader = (await submitter._runs()).reader
    async with reader.open(run_id, seen=seen, partials=True) as run:
        rest = [item async for item in run.items()]
    kinds = [type(i).__name__ if not isinstance(i, dict) else i.get("type") for i in rest]
    # (The verdict may share its millisecond with the attempt it judged: then it comes
    # first, a partial or verdict going before an entry of its millisecond.)
    assert sorted(kinds) == sorted(["Partial", "draft:attempt", "Verdict", "draft:verdict",
                                    "answer"]), rest
    assert kinds[0] == "Partial" and kinds[-1] == "answer"
    assert kinds.index("Verdict") < kinds.index("draft:verdict")
    (verdict,) = [item for item in rest if isinstance(item, Verdict)]
    assert rest[0].text == "1" and verdict.passed is True


async def test_a_streamed_loop_on_a_cluster(
    cluster: ValkeyCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine partitions over three masters: each run's partials stream lives in its
    partition's slot, beside the streams its followers read with it (one XREAD per
    partition), and the writer's batch spans slots."""
    monkeypatch.setenv("PRINTERY_PARTITIONS", "9")
    client = connect(cluster.url)
    keys = StreamKeys(prefix, 9)
    work = Streaming()  # attempt 1 holds until every follower has its first chunk
    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work.work,
                      validate=work.validate, max_attempts=3, concurrency=4))
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in pipeline.build_workers(client=client, keys=keys, settings=ConsumerSettings(
            block_ms=100, retry_backoff_ms=10, max_deliveries=3)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        async with Client(cluster.url, stream_prefix=prefix, app=pipeline) as submitter:
            runs = [await submitter.submit({"n": n}) for n in range(4)]
            stories: list[list[Any]] = [[] for _ in runs]
            watching = [asyncio.create_task(_collect(submitter.watch(run_id, timeout=30), told))
                        for run_id, told in zip(runs, stories, strict=True)]

            async def every_first_chunk() -> bool:
                return all(any(isinstance(i, Partial) for i in told) for told in stories)

            await wait_for(every_first_chunk, timeout=20)
            work.go_on.set()
            await asyncio.wait_for(asyncio.gather(*watching), 30)
    finally:
        await manager.stop_all(2)
        await client.aclose()
    assert len({keys.of(run_id).partition for run_id in runs}) > 1
    for told in stories:
        drafts = Drafts()
        for item in told:
            if not isinstance(item, dict):
                drafts.add(item)
        assert [(d.attempt, d.text, d.state) for d in drafts.drafts] == [
            (1, "draft 1", "retracted"), (2, "draft 2", "committed")]
        assert told[-1]["stream"] == "answer"


async def _collect(items: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in items:
        into.append(item)


async def test_a_follower_joining_a_read_under_way_gets_the_partials_live_at_once(
    running: Any, client: aioredis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition's read blocks for 8 s (no entry comes to end it): a follower that
    joins it mid-block reads its run's partials itself meanwhile, so a chunk shown after
    it joined reaches it long before that block ends."""
    monkeypatch.setattr(tail, "BLOCK_MS", 8000)
    gates = {"other": asyncio.Event(), "this": asyncio.Event(), "end": asyncio.Event()}
    pipeline = Pipeline("answers", ingress=["request"])

    @pipeline.step("write", consumes=["request"], produces=["answer"], concurrency=2)
    async def write(message: Message) -> Output:
        name = message.data["name"]
        await message.partial(f"{name} draft")
        await gates[name].wait()
        await message.partial(" and more")
        await gates["end"].wait()
        return Output("answer", {"text": "done"})

    submitter = await running(pipeline)
    other = await submitter.submit({"name": "other"})
    run_id = await submitter.submit({"name": "this"})
    await wait_for(lambda: _shown_text(client, prefix, run_id, "this draft"), timeout=10)
    other_items: list[Any] = []
    reading = asyncio.create_task(_collect(submitter.watch(other, timeout=60), other_items))
    await wait_for(lambda: _has(other_items, "other draft"), timeout=10)  # the read blocks
    items: list[Any] = []
    following = asyncio.create_task(_collect(submitter.watch(run_id, timeout=60), items))
    await wait_for(lambda: _has(items, "this draft"), timeout=10)
    gates["this"].set()
    await wait_for(lambda: _has(items, " and more"), timeout=5, message="the chunk, live")
    for gate in gates.values():
        gate.set()
    await asyncio.wait_for(asyncio.gather(reading, following), 30)
    assert [type(i).__name__ if not isinstance(i, dict) else i["stream"] for i in items] == [
        "request", "Partial", "Partial", "Verdict", "answer"]


def _expensive_drafts(on_exceeded: str, expensive: int = 1) -> Pipeline:
    """A loop whose streamed attempt ``expensive`` spends twice the run's budget of 1 usd
    (the attempts before it are free, and refused)."""

    async def work(message: Message) -> AsyncIterator[str]:
        if message.attempt == expensive:
            message.report_cost("usd", 2.0)
            yield "an expensive draft"
        else:
            yield "a free draft"

    def validate(message: Message) -> list[Reason]:
        return [] if message.attempt >= expensive else [Reason("not_yet")]

    pipeline = Pipeline("answers", ingress=["request"], cost_units=["usd"],
                        budget=Budget(usd=1.0, on_exceeded=on_exceeded))
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=validate, max_attempts=3, cost_units=["usd"]))
    return pipeline


async def test_a_budget_that_stops_the_run_before_the_verdict_retracts_the_draft(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """An attempt that streamed and spent the run's whole budget is never judged (the
    budget holds the judging turn and stops the run): its draft is retracted, naming the
    budget, so no follower keeps a draft that never gets a verdict."""
    submitter = await running(_expensive_drafts("stop"))
    run_id = await submitter.submit({"question": "why?"})
    result = await submitter.result(run_id, timeout=30)
    assert result.status == "budget_exceeded"
    found = await shown(client, prefix, run_id)
    assert found[0] == {"step": "draft", "attempt": 1, "text": "an expensive draft"}
    assert len(found) == 2 and found[1]["passed"] is False
    assert [reason["code"] for reason in found[1]["reasons"]] == ["budget_exceeded"]


@pytest.mark.parametrize("expensive", [1, 2])
async def test_a_budget_review_rejected_retracts_the_held_attempts_draft(
    running: Any, client: aioredis.Redis, prefix: str, expensive: int
) -> None:
    """An attempt that streamed and spent past a ``review`` budget is held for the
    review; rejected, it will never be judged: the rejection retracts its draft, naming
    the budget (found by the random composition fuzz: a draft with no verdict; the
    second attempt's, by a hostile run)."""
    from printery.inbox import reviews

    pipeline = _expensive_drafts("review", expensive)
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "why?"})
    keys = StreamKeys(prefix)

    async def review() -> list[dict[str, Any]]:
        return await reviews.list_reviews(client, keys, pipeline)

    (opened,) = await wait_for(review, timeout=10, message="the budget review")
    before = (await shown(client, prefix, run_id))[:-1]
    assert len(before) == 2 * (expensive - 1)  # the free attempts, each judged
    assert (await shown(client, prefix, run_id))[-1] == {
        "step": "draft", "attempt": expensive, "text": "an expensive draft"}, "held: open"
    joined = asyncio.Event()  # the follower got the held attempt's open draft

    async def follow() -> list[Any]:
        items = []
        async for item in submitter.watch(run_id, timeout=30):
            items.append(item)
            if isinstance(item, Partial) and item.attempt == expensive:
                joined.set()
        return items

    follower = asyncio.create_task(follow())
    await asyncio.wait_for(joined.wait(), 10)
    await reviews.reject(client, keys, pipeline, opened["id"], by="ops", note="too dear")
    result = await submitter.result(run_id, timeout=30)
    assert result.status == "budget_exceeded"
    found = (await shown(client, prefix, run_id))[len(before):]
    assert len(found) == 2 and found[1]["passed"] is False, found
    assert found[1]["attempt"] == expensive
    assert [reason["code"] for reason in found[1]["reasons"]] == ["budget_exceeded"]
    assert "too dear" in found[1]["reasons"][0]["message"]
    # The follower, which closes at the outcome, got the retraction before it (it was
    # written after the outcome, so a follower missed it: found by a hostile run).
    watched = await follower
    assert [(v.attempt, v.passed) for v in watched if isinstance(v, Verdict)][-1:] == [
        (expensive, False)], watched


async def test_a_draft_whose_output_cannot_be_written_is_retracted(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    """A call that streamed and then returned what JSON cannot encode is dead-lettered at
    once (``output_not_serializable``): its draft is retracted with that reason, a loop
    attempt's (judged by a call that will never come) as a plain step's (whose verdict
    waits for its outputs to be written), so no draft is left without a verdict (found by
    the random composition fuzz)."""
    from decimal import Decimal

    async def work(message: Message) -> Any:
        await message.partial("a first ")
        return {"amount": Decimal("1.5")}

    async def plain(message: Message) -> Output:
        await message.partial("shown, then ")
        return Output("said", {"amount": Decimal("2.5")})

    looped = Pipeline("looped", ingress=["request"])
    looped.add(Loop("draft", consumes="request", produces="answer", work=work,
                    validate=lambda message: [], max_attempts=2))
    stepped = Pipeline("stepped", ingress=["ask"])
    stepped.step("say", consumes=["ask"], produces=["said"])(plain)
    for pipeline, step in ((looped, "draft"), (stepped, "say")):
        submitter = await running(pipeline)
        run_id = await submitter.submit({"question": "how much?"})
        result = await submitter.result(run_id, timeout=10)
        assert result.status == "failed", result
        found = await shown(client, prefix, run_id)
        assert found and found[0]["step"] == step and "text" in found[0], found
        assert found[-1]["passed"] is False, found
        assert [r["code"] for r in found[-1]["reasons"]] == ["output_not_serializable"], found
        assert sum("passed" in item for item in found) == 1, "one verdict, and no pass"


async def test_a_call_that_returns_past_its_timeout_retracts_what_it_showed(
    client: aioredis.Redis,
) -> None:
    """A call that blocked the event loop past its timeout and then returned is not
    taken (reference: failures): what it showed is retracted, so no follower is left with
    a draft that never gets a verdict (what the composition fuzz found under load)."""
    pipeline = Pipeline("late", ingress=["ask"])

    @pipeline.step("draft", consumes=["ask"], produces=["answer"], timeout=0.2)
    async def draft(message: Message) -> Output:
        await message.partial("hello ")
        time.sleep(0.4)  # noqa: ASYNC251 - a blocking call, on purpose
        return Output("answer", {"text": "too late"})

    keys = StreamKeys(unique_prefix("late"))
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in pipeline.build_workers(
            client=client, keys=keys, settings=ConsumerSettings(block_ms=50, max_deliveries=1)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        await client.xadd(keys.stream("ask"), {"data": "{}", "correlation_id": "r-1"})
        stream = keys.of("r-1").partials("r-1")

        async def verdicts() -> list[dict[str, str]]:
            return [f for _, f in await client.xrange(stream) if f["kind"] == "verdict"]

        [verdict] = await wait_for(verdicts, timeout=20)
        [letter] = await wait_for(lambda: _read_all(client, keys.stream("dlq")), timeout=20)
    finally:
        await manager.stop_all(2)
    assert verdict["passed"] == "0" and "past its timeout" in verdict["reasons"]
    assert letter["reason_code"] == "timeout"
    assert await client.xlen(keys.stream("answer")) == 0


async def _read_all(client: aioredis.Redis, stream: str) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(stream)]
