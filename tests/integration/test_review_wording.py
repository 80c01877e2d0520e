"""A Loop's review says how many attempts failed in plain English: "1 attempt did not
pass validation" (before: "1 attempts")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import Loop, Message, Pipeline, Reason, StreamKeys
from printery.inbox import reviews
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from support.spine import pipeline_starter


@pytest.fixture
async def running(server: ServerProcess, client: aioredis.Redis, prefix: str) -> AsyncIterator[Any]:
    async with pipeline_starter(server.url, client, prefix, max_deliveries=3) as start:
        yield start


async def _draft(message: Message) -> dict[str, Any]:
    return {"text": "short"}


def _never(message: Message) -> list[Reason]:
    return [Reason("too_short", "text", "5 characters")]


async def test_one_failed_attempt_is_one_attempt(running: Any, client: aioredis.Redis,
                                                 prefix: str) -> None:
    pipeline = Pipeline("answers", ingress=["request"])
    pipeline.add(Loop("draft", consumes="request", produces="answer", work=_draft,
                      validate=_never, max_attempts=1, review_kind="answer_review"))
    submitter = await running(pipeline)
    run_id = await submitter.submit({"question": "q"})

    async def review() -> dict[str, Any] | None:
        found = await reviews.list_reviews(client, StreamKeys(prefix), pipeline)
        return next((r for r in found if r["correlation_id"] == run_id), None)

    opened = await wait_for(review, timeout=20, message="the review")
    assert opened is not None
    assert opened["reason"] == ("1 attempt did not pass validation; the last: too_short "
                                "(text): 5 characters")
