"""The pipeline framework on its own: graph validation, contracts, gates, policies,
escalation and cost units, on a real server with a pipeline that knows no deployments."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from printery import (
    Aggregator,
    ConsumerSettings,
    JoinState,
    Message,
    Output,
    Pipeline,
    PipelineError,
    Step,
    WorkerManager,
    all_must_pass,
    any_pass,
    escalate,
    first_wins,
)
from printery.testing import wait_for
from printery.wire.keys import StreamKeys


async def noop(message: Message) -> None:
    return None


def test_cycle_is_refused() -> None:
    p = Pipeline("p", ingress=["in"])
    p.add(Step("a", ("in", "b-out"), ("a-out",), noop))
    p.add(Step("b", ("a-out",), ("b-out",), noop))
    with pytest.raises(PipelineError, match="cycle"):
        p.validate()


def test_unproduced_input_is_refused() -> None:
    p = Pipeline("p", ingress=["in"])
    p.add(Step("a", ("in", "nobody-makes-this"), ("x",), noop))
    with pytest.raises(PipelineError, match="no step produces"):
        p.validate()


def test_unreachable_step_is_refused() -> None:
    p = Pipeline("p", ingress=["in", "side"])
    p.add(Step("a", ("in",), ("x",), noop))
    p.add(Step("island", ("y",), ("y2",), noop))
    p.add(Step("y-maker", ("y2",), ("y",), noop))
    with pytest.raises(PipelineError):
        p.validate()


def test_undeclared_cost_unit_refused_at_definition() -> None:
    p = Pipeline("p", ingress=["in"], cost_units=["tokens"])
    with pytest.raises(PipelineError, match="undeclared cost units"):
        p.add(Step("a", ("in",), ("x",), noop, cost_units=("dollars",)))


def test_start_order_follows_data_flow() -> None:
    p = Pipeline("p", ingress=["in"])
    p.add(Step("last", ("mid",), (), noop))
    p.add(Step("first", ("in",), ("mid",), noop))
    assert p.dependencies() == {"last": ("first",), "first": ()}


class Doc(BaseModel):
    text: str


class Summary(BaseModel):
    words: int


async def _run(client: aioredis.Redis, keys: StreamKeys, pipeline: Pipeline) -> WorkerManager:
    manager = WorkerManager()
    settings = ConsumerSettings(block_ms=100, retry_backoff_ms=10, max_deliveries=2)
    for worker, deps in pipeline.build_workers(client=client, keys=keys, settings=settings):
        manager.register(worker, deps)
    await manager.start_all()
    return manager


async def test_contracts_bad_input_to_dlq_with_reasons_bad_output_fails_loudly(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("docs", ingress=["doc"])

    @p.step("summarize", consumes=["doc"], produces=["summary"], input_model=Doc,
            output_models={"summary": Summary})
    async def summarize(message: Message) -> Output:
        words = len(message.data["text"].split())
        return Output("summary", {"words": words if words else "none"})

    manager = await _run(client, keys, p)
    try:
        await client.xadd(keys.stream("doc"), {"data": json.dumps({"text": "a b c"})})
        await client.xadd(keys.stream("doc"), {"data": json.dumps({"txt": 1})})
        await client.xadd(keys.stream("doc"), {"data": json.dumps({"text": ""})})
        await wait_for(lambda: client.xlen(keys.stream("summary")))
        await wait_for(lambda: _xlen_at_least(client, keys.dlq, 2), timeout=10)
        dlq = [fields for _, fields in await client.xrange(keys.dlq)]
        invalid = next(d for d in dlq if d["reason_code"] == "invalid_input")
        reasons = json.loads(invalid["error"])
        assert reasons[0]["code"] == "missing_field" and reasons[0]["field"] == "text"
        bug = next(d for d in dlq if d["reason_code"] == "max_deliveries_exceeded")
        assert "OutputContractError" in bug["error"]
        assert manager.get_status()["summarize"]["errors"] >= 2
    finally:
        await manager.stop_all(2)


async def _xlen_at_least(client: aioredis.Redis, key: str, n: int) -> bool:
    return int(await client.xlen(key)) >= n


def _state(arrived: dict[str, object], **kw: object) -> JoinState:
    return JoinState("c1", arrived, ("a", "b"), **kw)  # type: ignore[arg-type]


def test_merge_policies() -> None:
    strict = all_must_pass(status_of=lambda n, d: d["status"],  # type: ignore[index]
                           precedence=["rejected", "failed", "ok"], timeout_status="failed")
    assert strict(_state({"a": {"status": "ok"}})) is None
    assert strict(_state({"a": {"status": "ok"}, "b": {"status": "failed"}}))["status"] == "failed"
    assert strict(_state({"a": {"status": "ok"}}, timed_out=True, missing=("b",)))["missing"] == ["b"]
    anyp = any_pass(passed=lambda n, d: d == "yes")
    assert anyp(_state({"b": "yes"}))["branch"] == "b"
    assert anyp(_state({"a": "no"})) is None
    assert anyp(_state({"a": "no", "b": "no"}))["status"] == "failed"
    first = first_wins()
    assert first(_state({"b": 1}))["branch"] == "b"
    assert first(_state({})) is None


async def test_aggregator_joins_branches_once_and_records_late(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("fan", ingress=["job"])

    @p.step("left", consumes=["job"], produces=["left-done"])
    async def left(message: Message) -> Output:
        return Output("left-done", {"side": "left"})

    @p.step("right", consumes=["job"], produces=["right-done"])
    async def right(message: Message) -> Output:
        return Output("right-done", {"side": "right"})

    agg = Aggregator("join", opens="job", opens_as="job",
                     branches={"left-done": "left", "right-done": "right"}, emits="joined",
                     policy=first_wins(), deadline=30)
    p.add(agg.step())
    manager = await _run(client, keys, p)
    try:
        await client.xadd(keys.stream("job"), {"data": json.dumps({"correlation_id": "j1"})})
        await wait_for(lambda: _xlen_at_least(client, keys.stream("joined"), 1))
        # Wait for both branches to have been recorded; the second is late and not emitted.
        join_key = keys.join("join", "j1")
        await wait_for(lambda: _has_late(client, join_key), timeout=10)
        assert await client.xlen(keys.stream("joined")) == 1
    finally:
        await manager.stop_all(2)


async def _has_late(client: aioredis.Redis, key: str) -> bool:
    return any(k.startswith("late:") for k in await client.hkeys(key))


async def test_escalation_retry_fallback_review_terminal(client: aioredis.Redis, prefix: str) -> None:
    keys = StreamKeys(prefix)
    p = Pipeline("esc", ingress=["task"])
    attempts: list[int] = []

    async def flaky(message: Message) -> Output:
        attempts.append(message.deliveries)
        raise RuntimeError("model unavailable")

    async def fallback(message: Message) -> Output:
        if message.data.get("fallback_ok"):
            return Output("result", {"via": "fallback"})
        raise RuntimeError("fallback unavailable too")

    def terminal(message: Message, exc: BaseException) -> Output:
        return Output("result", {"via": "terminal", "status": "failed"})

    p.add(Step("work", ("task",), ("result", "review"),
               escalate(flaky, attempts=2, fallback=fallback, review_kind="model_failed",
                        terminal=terminal)))
    manager = await _run(client, keys, p)
    try:
        await client.xadd(keys.stream("task"), {"data": json.dumps({"fallback_ok": True, "correlation_id": "t1"})})
        await client.xadd(keys.stream("task"), {"data": json.dumps({"correlation_id": "t2"})})
        await wait_for(lambda: _xlen_at_least(client, keys.stream("result"), 2), timeout=10)
        results = {f["correlation_id"]: json.loads(f["data"]) for _, f in await client.xrange(keys.stream("result"))}
        assert results["t1"] == {"via": "fallback"}
        assert results["t2"]["via"] == "terminal"
        (_, review), = await client.xrange(keys.review)
        assert review["kind"] == "model_failed" and review["correlation_id"] == "t2"
        assert await client.xlen(keys.dlq) == 0, "escalated, not dead-lettered"
        assert attempts.count(1) == 2 and attempts.count(2) == 2, "bounded: 2 attempts each"
    finally:
        await manager.stop_all(2)
