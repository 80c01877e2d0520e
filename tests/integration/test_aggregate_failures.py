"""A join whose merge policy fails at its deadline stays with that join
(docs/reference.md, Failures): it is retried on later sweeps, then written to ``dlq`` once
with the reason; the aggregator keeps running and finishes its other joins. On a real
server."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import Aggregator, ConsumerSettings, JoinState, Pipeline, WorkerManager
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import CODEC

MAX_DELIVERIES = 3


class FlakyPolicy:
    """Decides every join at its deadline, except those whose id starts with ``bad``: for
    them it raises ``error`` (None: returns None). Counts its calls at the deadline per join."""

    def __init__(self, error: Callable[[str], Exception] | None) -> None:
        self.error = error
        self.calls: Counter[str] = Counter()

    def __call__(self, state: JoinState) -> Any | None:
        if not state.timed_out:
            return None
        self.calls[state.correlation_id] += 1
        if state.correlation_id.startswith("bad"):
            if self.error is None:
                return None  # no decision where one is required
            raise self.error(f"cannot merge {state.correlation_id}")
        return {"status": "timed_out", "missing": list(state.missing)}


@asynccontextmanager
async def aggregators(
    client: aioredis.Redis, keys: StreamKeys, policy: FlakyPolicy, copies: int = 1
) -> AsyncIterator[list[WorkerManager]]:
    """``copies`` aggregator workers of one group, each under a manager of its own (as in
    as many processes) with its own sweeper; joins open on ``job`` and wait for ``left``."""
    settings = ConsumerSettings(block_ms=100, retry_backoff_ms=20, retry_backoff_cap_ms=200,
                                max_deliveries=MAX_DELIVERIES)
    managers: list[WorkerManager] = []
    try:
        for _ in range(copies):
            pipeline = Pipeline("agg", ingress=["job", "left-done"])
            agg = Aggregator("join", opens="job", opens_as="job", branches={"left-done": "left"},
                             emits="joined", policy=policy, deadline=0.3, sweep_interval=0.05)
            pipeline.add(agg.step())
            manager = WorkerManager()
            for worker, deps in pipeline.build_workers(client=client, keys=keys, settings=settings):
                manager.register(worker, deps)
            managers.append(manager)
            await manager.start_all()
        yield managers
    finally:
        for manager in managers:
            await manager.stop_all(2)


async def open_join(client: aioredis.Redis, keys: StreamKeys, cid: str) -> None:
    envelope = CODEC.new("job", {"job": cid}, correlation_id=cid, producer="test")
    await client.xadd(keys.stream("job"), CODEC.encode(envelope))


async def joined(client: aioredis.Redis, keys: StreamKeys) -> list[str]:
    return [fields["correlation_id"] for _, fields in await client.xrange(keys.stream("joined"))]


async def dead_letters(client: aioredis.Redis, keys: StreamKeys) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(keys.dlq)]


def assert_running(managers: list[WorkerManager]) -> None:
    for manager in managers:
        for name, status in manager.get_status().items():
            assert status["state"] == "running" and status["healthy"], (name, status)
            assert status["restarts"] == 0, (name, status)
        assert not manager.failures and not manager.failed.is_set()


@pytest.mark.parametrize("error", [ValueError, ConnectionRefusedError],
                         ids=["ValueError", "OSError-subclass"])
async def test_policy_failing_at_deadline_goes_to_dlq_once_and_worker_keeps_going(
    client: aioredis.Redis, prefix: str, error: Callable[[str], Exception]
) -> None:
    # An OSError from a policy (e.g. a refused connection of its own) is the join's failure
    # too, not a lost connection to Redis that the sweeper would wait out for ever.
    keys, policy = StreamKeys(prefix), FlakyPolicy(error)
    async with aggregators(client, keys, policy) as managers:
        await open_join(client, keys, "bad-1")
        await open_join(client, keys, "good-1")
        dlq = await wait_for(lambda: dead_letters(client, keys), message="dlq entry")
        await wait_for(lambda: joined(client, keys), message="good join finished")

        # After the dead letter: another join still finishes, so sweeps went on; by then
        # the bad join is out of the deadlines and no longer evaluated.
        await open_join(client, keys, "good-2")
        await wait_for(lambda: _has(joined(client, keys), "good-2"), message="second good join")
        assert_running(managers)

        assert await joined(client, keys) == ["good-1", "good-2"]
        assert await dead_letters(client, keys) == dlq and len(dlq) == 1
        assert policy.calls == {"bad-1": MAX_DELIVERIES, "good-1": 1, "good-2": 1}
        entry = dlq[0]
        assert entry["reason_code"] == "merge_failed"
        assert entry["error"] == f"{error.__name__}: cannot merge bad-1"  # type: ignore[attr-defined]
        assert entry["worker"] == "join" and entry["deliveries"] == str(MAX_DELIVERIES)
        assert entry["correlation_id"] == "bad-1" and entry["failed_at"]
        assert entry["source_stream"] == keys.stream("job") and entry["source_id"] == ""
        assert json.loads(entry["data"]) == {"job": {"job": "bad-1"}}
        trace = entry["traceback"]
        assert "in __call__" in trace and "raise self.error" in trace, trace
        assert len(trace) <= 4000
        assert not await client.zscore(keys.join_deadlines("join"), "bad-1")
        # The run ends failed with it (docs/reference.md, Failures), naming its dead letter.
        (ended,) = [f for _, f in await client.xrange(keys.stream("run:failed"))]
        dlq_id = (await client.xrange(keys.dlq))[0][0]
        assert ended["correlation_id"] == "bad-1"
        assert json.loads(ended["data"]) == {
            "status": "failed", "step": "join", "reason_code": "merge_failed",
            "error": entry["error"], "dlq_id": dlq_id}

        # The dead letter took the join's result guard: a branch arriving now is late.
        envelope = CODEC.new("left-done", {"side": "left"}, correlation_id="bad-1", producer="test")
        await client.xadd(keys.stream("left-done"), CODEC.encode(envelope))
        await wait_for(lambda: _late(client, keys.join("join", "bad-1")), message="late arrival")
        assert await joined(client, keys) == ["good-1", "good-2"]
        assert len(await dead_letters(client, keys)) == 1


async def test_two_sweepers_count_one_join_once_per_attempt(client: aioredis.Redis, prefix: str) -> None:
    """Sweepers lease the joins they take: two never evaluate one join at once, so the
    attempts are counted once each and the dead letter is written once."""
    keys, policy = StreamKeys(prefix), FlakyPolicy(RuntimeError)
    async with aggregators(client, keys, policy, copies=2) as managers:
        for i in range(5):
            await open_join(client, keys, f"bad-{i}")
            await open_join(client, keys, f"good-{i}")
        await wait_for(lambda: _count(dead_letters(client, keys), 5), message="5 dlq entries")
        await wait_for(lambda: _count(joined(client, keys), 5), message="5 good joins")
        assert_running(managers)
        dlq = await dead_letters(client, keys)
        assert sorted(e["correlation_id"] for e in dlq) == [f"bad-{i}" for i in range(5)]
        assert sorted(await joined(client, keys)) == [f"good-{i}" for i in range(5)]
        assert {cid: n for cid, n in policy.calls.items() if cid.startswith("bad")} == {
            f"bad-{i}": MAX_DELIVERIES for i in range(5)}


async def test_policy_deciding_nothing_at_deadline_is_a_failure_too(
    client: aioredis.Redis, prefix: str
) -> None:
    """A join is never dropped silently: a policy that must decide and does not is retried,
    then dead-lettered like one that raises."""
    keys, policy = StreamKeys(prefix), FlakyPolicy(None)
    async with aggregators(client, keys, policy) as managers:
        await open_join(client, keys, "bad-1")
        await open_join(client, keys, "good-1")
        (entry,) = await wait_for(lambda: dead_letters(client, keys), message="dlq entry")
        await wait_for(lambda: joined(client, keys), message="good join finished")
        assert_running(managers)
        assert entry["reason_code"] == "merge_failed" and entry["correlation_id"] == "bad-1"
        assert entry["error"].startswith("JoinFailed: the merge policy made no decision")
        assert policy.calls["bad-1"] == MAX_DELIVERIES


async def _has(items: Any, item: str) -> bool:
    return item in await items


async def _count(items: Any, n: int) -> bool:
    return len(await items) >= n


async def _late(client: aioredis.Redis, key: str) -> bool:
    return any(k.startswith("late:") for k in await client.hkeys(key))
