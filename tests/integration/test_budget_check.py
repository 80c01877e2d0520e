"""The check of a run's budget before its handlers (runtime/budget_guard.py): every read
of a step with a hard limit also counts the runs at one (``ZCARD``, run by the server
right after the read), so while no run is over, no batch asks for its runs (no
``ZMSCORE``, seen in the server's own command log); once one is, the steps after the
breach ask, and hold its entries."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis

from printery import Budget, Message, Output, Pipeline
from printery.wire.keys import StreamKeys
from support.spine import pipeline_starter


async def test_the_runs_are_checked_only_once_one_is_over(
    server: Any, client: aioredis.Redis, prefix: str
) -> None:
    calls: dict[str, list[str]] = {"a": [], "b": [], "c": []}

    def relay(name: str, out: str) -> Any:
        async def handle(message: Message) -> Output:
            calls[name].append(message.correlation_id)
            message.report_cost("tokens", message.data["spend"] if name == "a" else 1)
            return Output(out, message.data)
        return handle

    pipeline = Pipeline("chain", ingress=["t0"], cost_units=["tokens"],
                        budget=Budget(tokens=50, on_exceeded="stop"))
    for name, consumes, out in (("a", "t0", "t1"), ("b", "t1", "t2"), ("c", "t2", "done")):
        pipeline.step(name, consumes=[consumes], produces=[out],
                      cost_units=["tokens"])(relay(name, out))
    checks: list[str] = []

    async def watch() -> None:
        async with aioredis.Redis.from_url(server.url, decode_responses=True).monitor() as log:
            async for command in log.listen():
                text = command.get("command", "")
                if text.startswith("ZMSCORE") and f"{prefix}:" in text:
                    checks.append(text)

    watcher = asyncio.create_task(watch())
    try:
        async with pipeline_starter(server.url, client, prefix, max_deliveries=2) as start:
            submitter = await start(pipeline)
            for n in range(3):
                run = await submitter.submit({"spend": 1}, run_id=f"cheap-{n}")
                assert (await submitter.result(run, timeout=10)).status == "done"
            assert checks == [], "no run over its budget: no batch asked for its runs"
            run = await submitter.submit({"spend": 100}, run_id="dear")
            result = await submitter.result(run, timeout=10)
        assert result.status == "budget_exceeded", result
        assert "dear" in calls["a"] and "dear" not in calls["b"], "held after the breach"
        assert checks, "once a run is over, the steps after it ask for their runs"
        assert all(f"{StreamKeys(prefix).budgets_over}" in text for text in checks)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
