"""One definition, built into workers twice (docs/reference.md, Pipelines and steps:
``Step.bind``): a Map and an Aggregator hold no worker's state, so the same pipeline
object run by two managers on two prefixes at once keeps each one's joins, counts and
outcomes in its own prefix. (When a definition bound itself to the worker last built,
the first prefix's handlers kept their state in the second's keys: its join timed out
there, its outcome was written there, and its run never ended.)"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from printery import Aggregator, JoinState, Map, Message, Pipeline, StreamKeys
from printery.testing import unique_prefix
from support.spine import pipeline_starter


def upper(message: Message) -> str:
    return str(message.data).upper()


def at_deadline(state: JoinState) -> Any | None:
    """Decides only at the deadline (no review ever comes): the sweeper of the join's own
    prefix must find it."""
    if not state.timed_out:
        return None
    return {"status": "joined", "pages": state.arrived["pages"], "missing": list(state.missing)}


def definition() -> tuple[Pipeline, Map, Aggregator]:
    pipeline = Pipeline("twice", ingress=["doc", "review:done"])
    fanned = Map("pages", consumes="doc", produces="pages:merged",
                 split=lambda m: list(m.data["pages"]), each=upper)
    joined = Aggregator("join", opens="pages:merged", opens_as="pages",
                        branches={"review:done": "review"}, emits="joined",
                        policy=at_deadline, deadline=0.5, sweep_interval=0.05)
    pipeline.add(fanned)
    pipeline.add(joined)
    return pipeline, fanned, joined


async def test_one_definition_run_on_two_prefixes_keeps_each_ones_state_apart(
    server: Any, client: aioredis.Redis
) -> None:
    pipeline, fanned, joined = definition()
    before = (dict(vars(fanned)), dict(vars(joined)))
    first, second = unique_prefix("twice-a"), unique_prefix("twice-b")
    async with pipeline_starter(server.url, client, first, max_deliveries=2) as start_first, \
            pipeline_starter(server.url, client, second, max_deliveries=2) as start_second:
        on_first = await start_first(pipeline)
        on_second = await start_second(pipeline)  # the same objects, built again
        assert (dict(vars(fanned)), dict(vars(joined))) == before, "building changed them"
        runs = {first: await on_first.submit({"pages": ["a", "b", "c"]}, event_type="doc"),
                second: await on_second.submit({"pages": ["x", "y"]}, event_type="doc")}
        results = {first: await on_first.result(runs[first], timeout=20),
                   second: await on_second.result(runs[second], timeout=20)}

    assert results[first].data == {"status": "joined", "pages": {"items": ["A", "B", "C"],
                                                                 "failed": []},
                                   "missing": ["review"]}
    assert results[second].data == {"status": "joined", "pages": {"items": ["X", "Y"],
                                                                  "failed": []},
                                    "missing": ["review"]}
    for prefix, other in ((first, second), (second, first)):
        keys, elsewhere = StreamKeys(prefix), StreamKeys(other)
        run = runs[prefix]
        # Each run's outcome once, in its own prefix; none of its state in the other's.
        assert [fields["correlation_id"] for _, fields in
                await client.xrange(keys.stream("joined"))] == [run], prefix
        assert await client.exists(keys.join("pages:collect", run)) == 1, prefix
        assert await client.exists(elsewhere.join("pages:collect", run),
                                   elsewhere.join("join", run)) == 0, prefix
        assert await client.zscore(elsewhere.join_deadlines("join"), run) is None, prefix
