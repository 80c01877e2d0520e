"""A pipeline whose one call spends 100 tokens and whose next step always dead-letters
its entry, for the cost tests (docs/reference.md, Replay and cost; Budgets): run by
``printery-workers --app support.cost_app:pipeline`` subprocesses and read by the tests.

The run's budget comes from ``COST_APP_TOKENS`` (default 5000), read when the module is
imported: what the workers enforce is their environment's, which may not be the
operator tool's."""

from __future__ import annotations

import os

from printery import Budget, Message, Output, Pipeline, Reject

#: Tokens one call of ``ask`` reports.
CALL_TOKENS = 100

pipeline = Pipeline("cost-copies", ingress=["question"], cost_units=["tokens"],
                    budget=Budget(tokens=float(os.environ.get("COST_APP_TOKENS", "5000")),
                                  soft=0.5))


@pipeline.step("ask", consumes=["question"], produces=["answer"], cost_units=["tokens"])
async def ask(msg: Message) -> Output:
    msg.report_cost("tokens", CALL_TOKENS)
    return Output("answer", {"text": f"an answer to {msg.data['q']}"})


@pipeline.step("check", consumes=["answer"], produces=["checked"])
async def check(msg: Message) -> Output:
    raise Reject("never_good", "no answer passes this check")
