"""Validation loops (docs/reference.md, Validation loops) on a real server: attempts with
feedback, exhaustion, fallback, review with resume, replay from the loop, and a handler
failing mid-loop (neither losing nor repeating an attempt). Runs are submitted and read
with the real :class:`~printery.Client`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import (
    Budget,
    Client,
    Limit,
    Loop,
    Message,
    Pipeline,
    Reason,
    Reject,
    StreamKeys,
    replay,
)
from printery.inbox import reviews
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from support.spine import pipeline_starter


class Drafts:
    """A worker whose n-th attempt writes ``draft n``, a validator that passes only
    ``pass_on`` (``fallback`` writes what it is given); every call seen is recorded."""

    def __init__(self, pass_on: str = "draft 3", fallback_text: str | None = None,
                 fail_once_on: int | None = None) -> None:
        self.pass_on = pass_on
        self.fallback_text = fallback_text
        self.fail_once_on = fail_once_on
        self.seen: list[dict[str, Any]] = []

    async def work(self, message: Message) -> dict[str, Any]:
        self.seen.append({"run": message.correlation_id, "attempt": message.attempt,
                          "feedback": list(message.feedback), "data": message.data})
        if message.attempt == self.fail_once_on:
            self.fail_once_on = None
            raise RuntimeError("the model timed out")
        message.report_cost("tokens", 10 * message.attempt)
        return {"text": f"draft {message.attempt}"}

    async def fallback(self, message: Message) -> dict[str, Any]:
        self.seen.append({"run": message.correlation_id, "attempt": message.attempt,
                          "feedback": list(message.feedback), "fallback": True})
        return {"text": self.fallback_text}

    def validate(self, message: Message) -> list[Reason]:
        if message.data["text"] == self.pass_on:
            return []
        return [Reason("not_good_enough", "text", f"{message.data['text']!r} is not it")]

    def calls(self, run: str) -> list[dict[str, Any]]:
        return [call for call in self.seen if call["run"] == run]


def loop_pipeline(drafts: Drafts, **loop: Any) -> Pipeline:
    pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens"])
    options: dict[str, Any] = {"max_attempts": 3, **loop}
    if options.pop("with_fallback", False):
        options["fallback"] = drafts.fallback
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=drafts.work,
                      validate=drafts.validate, exhausted="answer:exhausted",
                      cost_units=["tokens"], **options))
    return pipeline


Running = Callable[[Pipeline], AsyncIterator[Client]]


@pytest.fixture
async def running(server: ServerProcess, client: aioredis.Redis, prefix: str) -> AsyncIterator[Any]:
    """Start ``pipeline``'s workers in this process; yields a submitting client."""
    async with pipeline_starter(server.url, client, prefix, max_deliveries=3) as start:
        yield start


def reasons_of(n: int) -> list[dict[str, str]]:
    return [{"code": "not_good_enough", "field": "text", "message": f"'draft {n}' is not it"}]


def earlier(*ns: int) -> list[dict[str, Any]]:
    return [{"attempt": n, "data": {"text": f"draft {n}"}, "reasons": reasons_of(n)} for n in ns]


async def test_an_attempt_sees_every_earlier_output_and_its_reasons_oldest_first(
    running: Any
) -> None:
    drafts = Drafts(pass_on="draft 3")
    client = await running(loop_pipeline(drafts))
    run_id = await client.submit({"question": "why?"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "draft 3"}
    calls = drafts.calls(run_id)
    assert [c["attempt"] for c in calls] == [1, 2, 3]
    assert [c["feedback"] for c in calls] == [[], earlier(1), earlier(1, 2)]
    assert all(c["data"] == {"question": "why?"} for c in calls)
    # Every attempt and verdict is an entry of the run (in the loop's stream, in order)
    # with its own time and cost. (Entries of different streams written in the same
    # millisecond have no order between them: the outcome may come before the verdict
    # committed with it, so the whole trace is read, not only up to the outcome.)
    trace = await client.entries(run_id)
    assert trace[0]["stream"] == "request" and result.entries[-1]["stream"] == "answer"
    loop = [e for e in trace if e["stream"] == "draft:loop"]
    assert [e["type"] for e in loop] == ["draft:attempt", "draft:verdict"] * 3
    assert [e["cost"] for e in loop[::2]] == [{"tokens": 10}, {"tokens": 20}, {"tokens": 30}]
    assert all(e["producer"] == "draft" and "duration_ms" in e for e in loop)
    verdicts = [e["data"] for e in loop[1::2]]
    assert [(v["attempt"], v["passed"], v["next"]) for v in verdicts] == [
        (1, False, "retry"), (2, False, "retry"), (3, True, "passed")]


async def test_exhaustion_without_review_writes_every_attempt(running: Any) -> None:
    drafts = Drafts(pass_on="never")
    client = await running(loop_pipeline(drafts, max_attempts=2))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "exhausted"
    assert result.entries[-1]["stream"] == "answer:exhausted"
    assert result.data == {"status": "exhausted", "attempts": [
        {"attempt": 1, "data": {"text": "draft 1"},
         "reasons": [{"code": "not_good_enough", "field": "text", "message": "'draft 1' is not it"}]},
        {"attempt": 2, "data": {"text": "draft 2"},
         "reasons": [{"code": "not_good_enough", "field": "text", "message": "'draft 2' is not it"}]},
    ]}
    assert [c["attempt"] for c in drafts.calls(run_id)] == [1, 2]


async def test_the_fallback_output_is_validated_too(running: Any) -> None:
    passing = Drafts(pass_on="fine", fallback_text="fine")
    client = await running(loop_pipeline(passing, max_attempts=2, with_fallback=True))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "fine"}
    last = passing.calls(run_id)[-1]
    assert last == {"run": run_id, "attempt": 3, "feedback": earlier(1, 2), "fallback": True}


async def test_a_fallback_that_fails_validation_is_exhausted_with_it(running: Any) -> None:
    failing = Drafts(pass_on="never", fallback_text="still bad")
    client = await running(loop_pipeline(failing, max_attempts=2, with_fallback=True))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "exhausted"
    attempts = result.data["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert attempts[2] == {"attempt": 3, "fallback": True, "data": {"text": "still bad"},
                           "reasons": [{"code": "not_good_enough", "field": "text",
                                        "message": "'still bad' is not it"}]}


async def _open_review(client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline,
                       run_id: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        for review in await reviews.list_reviews(client, keys, pipeline):
            if review["correlation_id"] == run_id:
                return review
        return None

    review = await wait_for(found, timeout=20, message=f"a review of {run_id}")
    assert review is not None
    return review


async def test_review_approval_resumes_with_the_edited_data_and_rejection_exhausts(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    drafts = Drafts(pass_on="never")
    pipeline = loop_pipeline(drafts, max_attempts=2, review_kind="answer_review")
    submitter = await running(pipeline)
    approved, rejected, as_is = [await submitter.submit({"question": q}) for q in "abc"]

    review = await _open_review(client, keys, pipeline, approved)
    assert review["kind"] == "answer_review" and review["step"] == "draft"
    assert review["data"] == {"text": "draft 2"}  # the last attempt's output
    assert review["resume_type"] == "answer" and review["reject_type"] == "answer:exhausted"
    assert "2 attempts did not pass" in review["reason"]
    await reviews.approve(client, keys, pipeline, review["id"], by="ana",
                          data={"text": "written by ana"})
    result = await submitter.result(approved, timeout=30)
    assert result.status == "answer" and result.data == {"text": "written by ana"}

    review = await _open_review(client, keys, pipeline, rejected)
    await reviews.reject(client, keys, pipeline, review["id"], by="ana", note="no")
    result = await submitter.result(rejected, timeout=30)
    assert result.entries[-1]["stream"] == "answer:exhausted" and result.status == "rejected"

    review = await _open_review(client, keys, pipeline, as_is)
    await reviews.approve(client, keys, pipeline, review["id"], by="ana")
    assert (await submitter.result(as_is, timeout=30)).data == {"text": "draft 2"}


async def test_a_handler_failing_mid_loop_neither_loses_nor_repeats_an_attempt(
    running: Any
) -> None:
    drafts = Drafts(pass_on="draft 3", fail_once_on=2)
    client = await running(loop_pipeline(drafts))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.data == {"text": "draft 3"}
    calls = drafts.calls(run_id)
    assert [c["attempt"] for c in calls] == [1, 2, 2, 3]  # attempt 2 ran again, as attempt 2
    assert calls[-1]["feedback"] == earlier(1, 2)
    trace = await client.entries(run_id)
    attempts = [e["data"]["attempt"] for e in trace if e["type"] == "draft:attempt"]
    assert attempts == [1, 2, 3]


async def test_replay_from_the_loop_starts_it_afresh(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    drafts = Drafts(pass_on="draft 2")
    pipeline = loop_pipeline(drafts)
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "q"})
    await submitter.result(run_id, timeout=30)
    again = await replay(client, StreamKeys(prefix), pipeline, run_id, from_step="draft")
    assert again.reruns == ["draft"]
    result = await submitter.result(again.new_id, timeout=30)
    assert result.data == {"text": "draft 2"}
    calls = drafts.calls(again.new_id)
    assert [(c["attempt"], c["feedback"]) for c in calls] == [(1, []), (2, earlier(1))]


# -- loops compose (docs/reference.md, Failures)
# ----------------------------------------------


class Down:
    """A worker whose model is down for the attempts in ``down`` (every delivery of them
    raises), a fallback that is down too when ``fallback_down``, a validator that passes
    anything; every call is recorded as ``(attempt, deliveries)``."""

    def __init__(self, down: set[int], *, fallback_down: bool = False, hang: bool = False) -> None:
        self.down = down
        self.fallback_down = fallback_down
        self.hang = hang
        self.calls: list[tuple[int, int]] = []
        self.fallback_calls: list[list[dict[str, Any]]] = []

    async def work(self, message: Message) -> dict[str, Any]:
        self.calls.append((message.attempt, message.deliveries))
        if message.attempt in self.down:
            if self.hang:
                await asyncio.Event().wait()  # never answers: the loop's timeout ends it
            raise RuntimeError("the model is down")
        return {"text": f"draft {message.attempt}"}

    async def fallback(self, message: Message) -> dict[str, Any]:
        self.fallback_calls.append(list(message.feedback))
        if self.fallback_down:
            raise ConnectionError("the fallback is down too")
        return {"text": "fallback"}

    def validate(self, message: Message) -> list[Reason]:
        return []


def down_pipeline(down: Down, **loop: Any) -> Pipeline:
    pipeline = Pipeline("answers", ingress=["request"], cost_units=["tokens"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=down.work,
                      validate=down.validate, exhausted="answer:exhausted",
                      cost_units=["tokens"], **loop))
    return pipeline


def failed(n: int, message: str, **more: Any) -> dict[str, Any]:
    return {"attempt": n, **more, "data": None,
            "reasons": [{"code": "work_failed", "field": "", "message": message}]}


async def test_work_failing_every_delivery_is_a_failed_attempt_and_the_next_one_runs(
    running: Any
) -> None:
    down = Down({1})
    client = await running(down_pipeline(down, max_attempts=3))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "draft 2"}
    # Attempt 1 was retried as a delivery (max_deliveries=3), then it failed as an attempt.
    assert down.calls == [(1, 1), (1, 2), (1, 3), (2, 1)]
    trace = await client.entries(run_id)
    verdicts = [e["data"] for e in trace if e["type"] == "draft:verdict"]
    assert verdicts[0]["reasons"] == failed(1, "work raised RuntimeError: the model is down")[
        "reasons"] and verdicts[0]["next"] == "retry"
    assert not await client.redis.xlen(client.keys.dlq)


async def test_a_model_that_is_down_reaches_the_fallback_not_the_dlq(running: Any) -> None:
    down = Down({1, 2})
    client = await running(down_pipeline(down, max_attempts=2, fallback=down.fallback))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.status == "answer" and result.data == {"text": "fallback"}
    said = "work raised RuntimeError: the model is down"
    assert down.fallback_calls == [[failed(1, said), failed(2, said)]]
    assert not await client.redis.xlen(client.keys.dlq)


@pytest.mark.slow  # about 10 s: the review of the exhausted run waits out its redeliveries
async def test_a_fallback_that_is_down_too_ends_exhausted_or_in_review(
    running: Any, client: aioredis.Redis, prefix: str
) -> None:
    down = Down({1}, fallback_down=True)
    submitter = await running(down_pipeline(down, max_attempts=1, fallback=down.fallback))
    run_id = await submitter.submit({"question": "q"})
    result = await submitter.result(run_id, timeout=30)
    assert result.status == "exhausted"
    assert result.data["attempts"] == [
        failed(1, "work raised RuntimeError: the model is down"),
        failed(2, "fallback raised ConnectionError: the fallback is down too", fallback=True)]
    assert len(down.fallback_calls) == 3  # the fallback's own deliveries

    keys = StreamKeys(prefix)
    reviewed = Down({1, 2}, fallback_down=True)
    pipeline = Pipeline("reviewed", ingress=["ask"])
    pipeline.add(Loop("think", consumes="ask", produces="told", work=reviewed.work,
                      validate=reviewed.validate, fallback=reviewed.fallback, max_attempts=2,
                      review_kind="think_review"))
    second = await running(pipeline)
    run_id = await second.submit({"question": "q"})
    review = await _open_review(client, keys, pipeline, run_id)
    assert review["data"] is None  # no attempt produced an output
    assert "work_failed" in review["reason"]
    await reviews.approve(client, keys, pipeline, review["id"], by="ana", data={"text": "mine"})
    assert (await second.result(run_id, timeout=30)).data == {"text": "mine"}


async def test_a_work_call_past_the_loops_timeout_is_a_failed_attempt(running: Any) -> None:
    down = Down({1}, hang=True)
    client = await running(down_pipeline(down, max_attempts=2, timeout=0.2))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    assert result.data == {"text": "draft 2"}
    assert down.calls == [(1, 1), (1, 2), (1, 3), (2, 1)]
    trace = await client.entries(run_id)
    (first, _) = [e["data"] for e in trace if e["type"] == "draft:verdict"]
    assert first["reasons"] == failed(
        1, "work did not finish within its timeout of 0.2 s")["reasons"]


async def test_a_reject_from_work_still_dead_letters_at_once(running: Any) -> None:
    async def work(message: Message) -> Any:
        raise Reject("not_a_question", "no")

    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=Drafts().validate, max_attempts=3))
    client = await running(pipeline)
    run_id = await client.submit({"question": "q"})
    await wait_for(lambda: client.redis.xlen(client.keys.dlq), timeout=20, message="dlq")
    ((_, letter),) = await client.redis.xrange(client.keys.dlq)
    assert letter["reason_code"] == "not_a_question" and letter["deliveries"] == "1"
    assert letter["correlation_id"] == run_id


async def test_a_loops_budget_and_limits_apply_to_every_attempt(running: Any) -> None:
    drafts = Drafts(pass_on="never")  # attempt n reports 10 n tokens
    keyed: list[str] = []

    def per_run(message: Message) -> str:
        keyed.append(message.data["question"])  # every turn's key sees the loop's input
        return f"run:{message.correlation_id}"

    client = await running(loop_pipeline(
        drafts, max_attempts=5, budget=Budget(tokens=25),
        limits=[Limit(per_run, concurrency=1)]))
    run_id = await client.submit({"question": "q"})
    result = await client.result(run_id, timeout=30)
    # Attempts 1 and 2 spent 30 tokens: attempt 3 never ran.
    assert result.status == "budget_exceeded" and result.data["spent"] == 30
    assert [c["attempt"] for c in drafts.calls(run_id)] == [1, 2]
    # The input, attempt 1 and its verdict were keyed (attempt 2's entry was held by the
    # budget before its limits), each on the loop's input.
    assert len(keyed) >= 3 and set(keyed) == {"q"}
