"""Cancelling a run (docs/reference.md, Cancelling a run) on a real server with real
workers: ``Client.cancel`` ends a running run ``cancelled`` once (of concurrent cancels,
exactly one wins), its running call is cancelled and writes nothing, nothing after it
runs, a step consuming ``run:cancelled`` compensates; a commit racing the cancel writes
none of its outputs but charges their cost; deadlines and supersedes cancel too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import RUN_CANCELLED, Client, Message, Output, Pipeline, UnknownRun
from printery.base import _json
from printery.runs.cost import cost_summary
from printery.testing import wait_for
from printery.transport.commit import Append, Committer, EntryCommit, StopCheck
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys
from support.spine import pipeline_starter


class Slow:
    """``slow``: reports a cost, then waits until cancelled (or ``release`` is set)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0
        self.after: list[str] = []
        self.compensated: list[dict[str, Any]] = []

    async def slow(self, message: Message) -> Output:
        message.report_cost("usd", 0.5)
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Output("slowed", message.data)

    async def then(self, message: Message) -> Output:
        self.after.append(message.correlation_id)
        return Output("done", {"status": "done"})

    async def undo(self, message: Message) -> Output:
        self.compensated.append(message.data)
        return Output("undone", {"run": message.correlation_id})


def slow_pipeline(handlers: Slow, **options: Any) -> Pipeline:
    pipeline = Pipeline("cancel", ingress=["doc"], outcomes=["done"], cost_units=["usd"],
                        **options)
    pipeline.step("slow", consumes=["doc"], produces=["slowed"], cost_units=["usd"],
                  timeout=60)(handlers.slow)
    pipeline.step("then", consumes=["slowed"], produces=["done"])(handlers.then)
    pipeline.step("undo", consumes=[RUN_CANCELLED], produces=["undone"])(handlers.undo)
    return pipeline


async def test_a_cancel_stops_the_running_call_and_ends_the_run_once(
    server: Any, client: aioredis.Redis, prefix: str
) -> None:
    handlers = Slow()
    keys = StreamKeys(prefix)
    async with pipeline_starter(server.url, client, prefix, max_deliveries=3) as start:
        runs = await start(slow_pipeline(handlers))
        run = await runs.submit({"n": 1})
        await asyncio.wait_for(handlers.started.wait(), 10)
        answers = await asyncio.gather(*(runs.cancel(run, reason="wrong file", by="ana")
                                         for _ in range(8)))
        assert sorted(answers) == [False] * 7 + [True], "exactly one cancel wins"
        result = await runs.result(run, timeout=10)
        assert result.status == "cancelled"
        assert result.data == {"status": "cancelled", "reason": "wrong file", "by": "ana"}
        assert await runs.cancel(run) is False, "an ended run: nothing changes"
        async def stopped_and_compensated() -> bool:
            return handlers.cancelled > 0 and bool(handlers.compensated)

        await wait_for(stopped_and_compensated, message="call cancelled, compensation run")
        assert handlers.compensated == [{"status": "cancelled", "reason": "wrong file",
                                         "by": "ana"}]
        async def settled() -> bool:  # the cancelled call is settled: acked, no output
            return not (await client.xpending(keys.stream("doc"), "slow"))["pending"]

        await wait_for(settled, message="the cancelled call settled")
        handlers.release.set()
    assert await client.xlen(keys.stream("slowed")) == 0
    assert handlers.after == []
    assert await client.xlen(keys.stream("undone")) == 1
    assert await client.xlen(keys.dlq) == 0
    status = await client.hget(keys.run_info(run), "status")
    assert status == "cancelled"
    assert await client.zscore(keys.run_index("cancelled"), run) is not None
    assert await client.zscore(keys.run_index("running"), run) is None


async def test_an_entry_of_a_cancelled_run_is_settled_before_its_handler(
    server: Any, client: aioredis.Redis, prefix: str
) -> None:
    """Cancelled while its entry waits in the stream: no handler ever sees it."""
    handlers = Slow()
    handlers.release.set()
    keys = StreamKeys(prefix)
    pipeline = slow_pipeline(handlers)
    async with Client(server.url, stream_prefix=prefix, app=pipeline) as runs:
        run = await runs.submit({"n": 2})
        assert await runs.cancel(run, reason="edited") is True
        async with pipeline_starter(server.url, client, prefix, max_deliveries=3) as start:
            await start(pipeline)
            async def compensated() -> bool:
                return bool(handlers.compensated)

            await wait_for(compensated, message="compensation run")
            # Read and acked by slow, never handled.
            await wait_for(lambda: _read_and_acked(client, keys.stream("doc"), "slow"),
                           message="the entry settled")
        assert not handlers.started.is_set(), "the handler never ran"
        assert (await runs.result(run, timeout=5)).status == "cancelled"


async def _read_and_acked(client: aioredis.Redis, stream: str, group: str) -> bool:
    (info,) = [g for g in await client.xinfo_groups(stream) if g["name"] == group]
    return bool(info["entries-read"]) and info["pending"] == 0


async def test_unknown_runs_are_refused(server: Any, client: aioredis.Redis, prefix: str) -> None:
    async with Client(server.url, stream_prefix=prefix,
                      app=slow_pipeline(Slow())) as runs:
        with pytest.raises(UnknownRun):
            await runs.cancel("never-submitted")


async def test_a_commit_racing_the_cancel_writes_nothing_but_charges_its_cost(
    client: aioredis.Redis, prefix: str
) -> None:
    """The check is in the commit: whatever process commits after the stop mark writes
    none of the run's outputs, acks the entry, and keeps the call's figures in
    ``withheld``, so the run's cost still counts it; a compensation entry is written."""
    keys = StreamKeys(prefix)
    stream, out = keys.stream("in"), keys.stream("out")
    await ensure_group(client, stream, "g")
    for n in range(3):
        await client.xadd(stream, {"data": str(n)})
    ((_, read),) = await client.xreadgroup("g", "c", {stream: ">"}, count=3)
    ids = [entry_id for entry_id, _ in read]
    await client.zadd(keys.stopped, {"r1": 1})

    def entry(n: int, run: str, check: bool = True) -> EntryCommit:
        fields = {"data": "{}", "producer": "step", "duration_ms": "1.000", "cid": run,
                  "cost": _json.dumps({"usd": 1}), "type": "out"}
        return EntryCommit(stream, "c", ids[n], f"k{n}", [Append(out, fields)],
                           stop=StopCheck(keys.stopped, keys.withheld, run) if check else None)

    committer = Committer(client, index_key=keys.idempotency_index("g"), group="g",
                          ttl_ms=60_000)
    try:
        assert await committer.commit([entry(0, "r1"), entry(1, "r2"),
                                       entry(2, "r1", check=False)]) == [1, 2, 2]
    finally:
        await committer.close()
    assert [f["cid"] for _, f in await client.xrange(out)] == ["r2", "r1"]
    assert (await client.xpending(stream, "g"))["pending"] == 0
    copies = [f for _, f in await client.xrange(keys.withheld)]
    assert [(f["cid"], f["withheld"]) for f in copies] == [("r1", "run_stopped")]
    pipeline = Pipeline("racing", ingress=["in"], cost_units=["usd"], correlation_field="cid")
    pipeline.step("step", consumes=["in"], produces=["out"], cost_units=["usd"])(
        lambda msg: None)
    summary = await cost_summary(client, keys, pipeline, "r1")
    assert summary["total"]["cost"] == {"usd": 2}


async def test_a_deadline_and_a_supersede_cancel_the_run(
    server: Any, client: aioredis.Redis, prefix: str
) -> None:
    from printery.runs.cancel import cancel_due
    keys = StreamKeys(prefix)
    pipeline = slow_pipeline(Slow())
    async with Client(server.url, stream_prefix=prefix, app=pipeline) as runs:
        first = await runs.submit({"n": 1}, supersede="chat-7")
        second = await runs.submit({"n": 2}, supersede="chat-7")
        answer = await runs.result(first, timeout=5)
        assert answer.status == "cancelled"
        assert answer.data == {"status": "cancelled", "reason": "superseded", "by": second}
        due = await client.zadd(keys.deadlines, {second: 0})
        assert due == 1
        assert await cancel_due(client, keys, pipeline, 1) == [second]
        ended = await runs.result(second, timeout=5)
        assert ended.data == {"status": "cancelled", "reason": "deadline_exceeded",
                              "by": "deadline"}
        timed = await runs.submit({"n": 3}, deadline=30)
        assert await client.zscore(keys.deadlines, timed) is not None
