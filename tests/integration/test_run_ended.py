"""A run gets one outcome, and a decision that changes nothing says so (docs/reference.md,
Review inbox; The API: /v1), on a real server with real workers, the real ``printery``
CLI and the ``/v1`` API served over real HTTP: a review approved after its join's
deadline ended the run is refused with ``run_ended`` (exit 1, 409) and writes nothing; a
review deadline after the run ended writes no second outcome, nor a join's deadline
after a review's deadline ended it; the commit itself withholds an outcome of an ended
run. And an entry of ``review`` that is no review request is not listed, nor decided."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from printery import ConsumerSettings, ReviewNotFound, StreamKeys
from printery.inbox import reviews
from printery.runs.facade import Runs
from printery.runtime.run_index import RunIndex, committed
from printery.servers.process import ServerProcess
from printery.service.access import Access
from printery.service.api import build_api
from printery.service.http import HttpServer
from printery.testing import wait_for
from printery.transport.commit import Append, Committer, EntryCommit
from printery.wire.envelope import Codec
from support import ended_app
from support.spine import running_pipeline

TESTS = Path(__file__).resolve().parents[1]
APP = "support.ended_app:pipeline"
LIMIT = 65536


class Provider:
    """What ``/status`` and friends answer: not under test here."""

    async def status(self) -> dict[str, Any]:
        return {}

    async def readiness(self) -> tuple[bool, list[str]]:
        return True, []

    def metrics(self) -> bytes:
        return b""


async def cli(url: str, prefix: str, *args: str) -> tuple[int, str, str]:
    """``printery --app support.ended_app:pipeline ARGS`` as a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "printery.cli.operator", "--redis-url", url,
        "--stream-prefix", prefix, "--app", APP, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def api(server: ServerProcess, client: aioredis.Redis,
              prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    """The ``/v1`` API of ``ended_app`` served in-process on 127.0.0.1."""
    runs = Runs(client, StreamKeys(prefix), ended_app.pipeline, payload_limit=LIMIT,
                producer="printery-api")
    http_server = HttpServer(Provider(), api=build_api(runs, Access(token=None, public=False),
                                                       body_limit=LIMIT))
    port = await http_server.start("127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=10) as http:
        yield http
    await http_server.stop()


async def submit(client: aioredis.Redis, keys: StreamKeys, *doc_ids: str) -> None:
    for doc_id in doc_ids:
        await client.xadd(keys.stream("doc"), {"data": json.dumps({"doc_id": doc_id})})


async def entries(client: aioredis.Redis, keys: StreamKeys, event_type: str,
                  doc_id: str) -> list[dict[str, Any]]:
    return [{**f, "data": json.loads(f["data"])}
            for _, f in await client.xrange(keys.stream(event_type)) if f["doc_id"] == doc_id]


async def review_of(client: aioredis.Redis, keys: StreamKeys, doc_id: str) -> str:
    async def found() -> str | None:
        return next((entry_id for entry_id, f in await client.xrange(keys.review)
                     if f.get("doc_id") == doc_id), None)

    return await wait_for(found, timeout=20, message=f"the review of {doc_id}")


async def ended(client: aioredis.Redis, keys: StreamKeys, doc_id: str,
                event_type: str) -> list[dict[str, Any]]:
    return await wait_for(lambda: entries(client, keys, event_type, doc_id), timeout=20,
                          message=f"the {event_type} of {doc_id}")


async def status(client: aioredis.Redis, keys: StreamKeys, doc_id: str) -> str | None:
    """The run's status as the run index holds it."""
    return await client.hget(keys.run_info(doc_id), "status")  # type: ignore[no-any-return]


async def decided(client: aioredis.Redis, keys: StreamKeys, review_id: str) -> dict[str, Any]:
    [record] = [f for _, f in await client.xrange(keys.review_decided)
                if f["review_id"] == review_id]
    return {**record, "data": json.loads(record["data"])}


async def test_an_approval_after_the_join_ended_the_run_changes_nothing_and_says_so(
        server: ServerProcess, client: aioredis.Redis, prefix: str,
        api: httpx.AsyncClient) -> None:
    """The join's deadline ends each run ``partial`` while its review is open; approving
    then (CLI, HTTP) is refused ``run_ended``, writes no ``doc:summary``, closes the
    review, and the run keeps its one outcome and status."""
    keys = StreamKeys(prefix)
    async with running_pipeline(ended_app.build(deadline=0.3), client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        await submit(client, keys, "by-cli", "by-http")
        ids = {doc: await review_of(client, keys, doc) for doc in ("by-cli", "by-http")}
        for doc in ids:
            [done] = await ended(client, keys, doc, "doc:done")
            assert done["data"]["status"] == "partial"
            assert await status(client, keys, doc) == "partial"

        code, out, err = await cli(server.url, prefix, "review", "approve", ids["by-cli"],
                                   "--by", "ana")
        assert code == 1, out
        assert "had already ended (partial)" in err and "changed nothing" in err, err
        assert "wrote" not in out

        answer = await api.post(f"/reviews/{ids['by-http']}/approve", json={"by": "bo"})
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "run_ended"
        assert "partial" in answer.json()["detail"]

        for doc, review_id in ids.items():
            assert await entries(client, keys, "doc:summary", doc) == [], "nothing written"
            record = await decided(client, keys, review_id)
            assert record["data"]["outputs"] == [] and record["data"]["reason_code"] == "run_ended"
            assert (record["decision"], record["doc_id"]) == ("approved", doc)
            # The review is closed: as for a decided one from now on.
            assert (await api.get(f"/reviews/{review_id}")).status_code == 404
            assert (await api.post(f"/reviews/{review_id}/reject",
                                   json={"by": "bo"})).status_code == 404
            assert len(await entries(client, keys, "doc:done", doc)) == 1
            assert await status(client, keys, doc) == "partial"
            shown = (await api.get(f"/runs/{doc}")).json()
            assert shown["status"] == "partial"
        assert await client.xlen(keys.review) == 0


async def test_a_review_deadline_after_the_run_ended_writes_no_second_outcome(
        client: aioredis.Redis, prefix: str) -> None:
    """The join ended the run ``partial``; the review's deadline then closes the review
    without writing its rejection (``doc:unsummarized``, an outcome)."""
    keys, pipeline = StreamKeys(prefix), ended_app.build(deadline=0.3)
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        await submit(client, keys, "late-review")
        review_id = await review_of(client, keys, "late-review")
        await ended(client, keys, "late-review", "doc:done")
        assert await reviews.expire_reviews(client, keys, pipeline, {"unsure": 0.001}) == []
        assert await entries(client, keys, "doc:unsummarized", "late-review") == []
        record = await decided(client, keys, review_id)
        assert (record["by"], record["data"]["reason_code"]) == ("timeout", "run_ended")
        assert await client.xlen(keys.review) == 0
        assert await status(client, keys, "late-review") == "partial"


async def test_a_join_deadline_after_a_review_deadline_ended_the_run_writes_no_second_outcome(
        client: aioredis.Redis, prefix: str) -> None:
    """The review's deadline rejects first (the run ends ``rejected``); the join's deadline
    then writes no ``partial``: the run keeps its first outcome."""
    keys, pipeline = StreamKeys(prefix), ended_app.build(deadline=3.0)
    async with running_pipeline(pipeline, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        await submit(client, keys, "late-join")
        await review_of(client, keys, "late-join")
        [rejection] = await reviews.expire_reviews(client, keys, pipeline, {"unsure": 0.001})
        assert rejection["outputs"] == ["doc:unsummarized"]
        assert await entries(client, keys, "doc:done", "late-join") == [], \
            "the review's deadline came first (too slow a machine for a 3 s join deadline)"
        assert await status(client, keys, "late-join") == "rejected"
        # The join's deadline passed and its sweep decided it (its once guard is taken).
        await wait_for(lambda: client.exists(keys.once("doc:done:late-join")), timeout=20,
                       message="the join's deadline")
        assert await entries(client, keys, "doc:done", "late-join") == []
        assert await status(client, keys, "late-join") == "rejected"
        [outcome] = await entries(client, keys, "doc:unsummarized", "late-join")
        assert outcome["data"]["status"] == "rejected"


async def test_the_commit_withholds_an_outcome_of_a_run_that_has_ended(
        client: aioredis.Redis, prefix: str) -> None:
    """One script run: a second outcome of a run it ends is withheld, and so is any
    outcome of a run the index says has ended (but a dead letter's ``run:failed`` gives
    way to one later outcome); what is no outcome is written; the index keeps each run's
    first status."""
    keys = StreamKeys(prefix)
    index = RunIndex(keys, outcomes=["end"])
    committer = Committer(client, index_key=keys.idempotency_index("g"), group="g",
                          ttl_ms=60_000, index_writes=partial(committed, index))
    codec = Codec(correlation_field="run")

    def output(event_type: str, run: str, status: str) -> Append:
        fields = codec.new_fields(event_type, {"status": status}, correlation_id=run,
                                  producer="t")
        return Append(keys.stream(event_type), fields)

    def emitted(run: str, *appends: Append) -> EntryCommit:
        return EntryCommit("", "", "", "", appends, mark=index.mark("", run, appends))

    try:
        results = await committer.commit([
            emitted("r1", output("end", "r1", "first"), output("note", "r1", "x")),
            emitted("r1", output("end", "r1", "second")),
            emitted("r2", output("end", "r2", "only"), output("end", "r2", "twice")),
        ])
        assert results == [3, 1, 2]
        # r4 ended by a dead letter: its run:failed gives way to a later outcome, once.
        await client.hset(keys.run_info("r4"), mapping={"status": "failed", "ended": "1",
                                                        "dead_letter": "1-0"})
        later = await committer.commit([emitted("r1", output("end", "r1", "third")),
                                        emitted("r3", output("end", "r3", "fresh")),
                                        emitted("r4", output("end", "r4", "after")),
                                        emitted("r4", output("end", "r4", "again"))])
        assert later == [1, 2, 2, 1]
    finally:
        await committer.close()
    written = [(f["run"], json.loads(f["data"])["status"])
               for _, f in await client.xrange(keys.stream("end"))]
    assert written == [("r1", "first"), ("r2", "only"), ("r3", "fresh"), ("r4", "after")]
    assert await client.xlen(keys.stream("note")) == 1
    for run, first in (("r1", "first"), ("r2", "only"), ("r3", "fresh"), ("r4", "after")):
        assert await status(client, keys, run) == first
        assert await client.zscore(keys.run_index(first), run) is not None
    assert await client.zcard(keys.run_index("second")) == 0
    assert await client.zcard(keys.run_index("third")) == 0


async def test_junk_in_review_is_no_review(server: ServerProcess, client: aioredis.Redis,
                                           prefix: str, api: httpx.AsyncClient) -> None:
    """Entries ``XADD``ed into ``review`` that name no kind or no run are not listed (a
    page is still full when more reviews follow them) and cannot be decided: 404, exit 1,
    ``ReviewNotFound``; nothing is written for them."""
    keys, pipeline = StreamKeys(prefix), ended_app.pipeline

    async def add(fields: dict[str, str]) -> str:
        return str(await client.xadd(keys.review, fields))  # type: ignore[arg-type]

    junk = [await add({"foo": "bar"}),
            await add({"kind": "", "doc_id": "d1", "data": "{}"})]
    first = await add({"kind": "unsure", "step": "summarize", "doc_id": "d1", "reason": "r",
                       "data": json.dumps({"doc_id": "d1"}), "resume_type": "doc:summary",
                       "reject_type": "doc:unsummarized"})
    junk += [await add({"kind": "unsure", "data": "not json"}),
             await add({"kind": "unsure", "doc_id": "bad\x07id"}),
             await add({"kind": "\x1b[2J", "doc_id": "d2"})]
    second = await add({"kind": "unsure", "step": "summarize", "reason": "r",
                        "data": json.dumps({"doc_id": "d2"})})  # its run named in its data

    listed = await reviews.list_reviews(client, keys, pipeline)
    assert [r["id"] for r in listed] == [first, second]
    assert [r["id"] for r in await reviews.list_reviews(client, keys, pipeline, limit=1)] == [first]
    assert [r["id"] for r in await reviews.list_reviews(
        client, keys, pipeline, limit=1, after=first)] == [second]
    page = await api.get("/reviews", params={"limit": "1"})
    assert [r["id"] for r in page.json()] == [first] and "rel=\"next\"" in page.headers["Link"]
    assert [r["id"] for r in (await api.get("/reviews")).json()] == [first, second]
    code, out, err = await cli(server.url, prefix, "review", "list", "--json")
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)] == [first, second]

    for review_id in junk:
        with pytest.raises(ReviewNotFound):
            await reviews.get_review(client, keys, pipeline, review_id)
        with pytest.raises(ReviewNotFound):
            await reviews.approve(client, keys, pipeline, review_id, by="ana")
        assert (await api.get(f"/reviews/{review_id}")).status_code == 404
        answer = await api.post(f"/reviews/{review_id}/approve", json={"by": "ana"})
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_review"
    code, _, err = await cli(server.url, prefix, "review", "approve", junk[0], "--by", "ana")
    assert code == 1 and "no open review" in err
    assert await client.xlen(keys.review_decided) == 0
    assert await client.exists(keys.stream("doc:summary")) == 0
    # The reviews themselves are decided as ever.
    await reviews.approve(client, keys, pipeline, first, by="ana")
    assert [f["doc_id"] for _, f in await client.xrange(keys.stream("doc:summary"))] == ["d1"]
