"""Pipelines with budgets for the budget tests, run by ``printery-workers --app
support.budget_app:<name>`` subprocesses and read by the tests.

``work`` reports 1 usd per call and writes ``done``; each call is first recorded in the
``calls`` stream (before it can commit), so a test can tell handler calls from commits.
The address of the server comes from ``BUDGET_APP_REDIS`` (the service's own setting
is removed from the children's environment by the test support)."""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis

from printery import Budget, Message, Output, Pipeline

#: Seconds each call takes: long enough for a kill -9 to catch calls in flight.
CALL_SECONDS = float(os.environ.get("BUDGET_APP_CALL_SECONDS", "0.3"))


def _build(name: str, budget: Budget) -> Pipeline:
    # A run is many jobs: only the budget ends it.
    built = Pipeline(name, ingress=["job"], cost_units=["usd"], correlation_field="run_id",
                     budget=budget, outcomes=())
    server: list[aioredis.Redis] = []

    @built.step("work", consumes=["job"], produces=["done"], cost_units=["usd"], concurrency=4)
    async def work(msg: Message) -> Output:
        if not server:
            server.append(aioredis.Redis.from_url(os.environ["BUDGET_APP_REDIS"]))
        prefix = msg.stream.rpartition(":job")[0]
        await server[0].xadd(f"{prefix}:calls", {"n": str(msg.data["n"])})
        await asyncio.sleep(CALL_SECONDS)
        msg.report_cost("usd", 1)
        return Output("done", {"n": msg.data["n"]}, idempotency_key=f"done:{msg.data['n']}")

    return built


stopping = _build("budget-stop", Budget(usd=10, soft=0.5))
reviewed = _build("budget-review", Budget(usd=2, on_exceeded="review"))
