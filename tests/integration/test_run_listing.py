"""Listing runs (printery/runs/listing.py: ``GET /v1/runs``, ``Client.runs``, ``printery
runs``) over the run index of a real server: newest first across partitions, a page
going on from a position (runs that start between two pages shift nothing, runs indexed
in one millisecond are each listed once), the status and since filters, and each run's
cost the one ``GET /v1/runs/{id}`` gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from printery import InvalidInput
from printery.base._json import dumps
from printery.runs.apps import load_app
from printery.runs.facade import Runs
from printery.runs.listing import RunListing, RunSummary, list_runs, listing_of, listing_of_query
from printery.runs.reader import RunReader, run_cost
from printery.runtime.run_index import RUNNING, RunIndex, now_ms
from printery.wire.keys import StreamKeys

REQUEST = {"service": "billing-api", "version": "1.0.0", "environment": "development",
           "requested_by": "alice", "notify": ["log"]}


async def _index(client: aioredis.Redis, index: RunIndex, run_id: str, at_ms: int,
                 status: str = "", ended_ms: int | None = None) -> None:
    """Index ``run_id`` as started at ``at_ms`` (and ended with ``status`` at ``ended_ms``)
    with the writes a commit makes, in the run's partition."""
    part = index.keys.of(run_id)
    within = index.within(part)
    mark = within.mark(part.stream(sorted(index.ingress)[0]), run_id, [])
    assert mark is not None
    for command in within.writes([mark], at_ms):
        await client.execute_command(*command)
    if status:
        ended = mark._replace(started=False, status=status)
        for command in within.writes([ended], ended_ms or at_ms):
            await client.execute_command(*command)


async def _every_page(reader: RunReader, listing: RunListing) -> list[list[RunSummary]]:
    pages = []
    while True:
        page, following = await list_runs(reader, listing)
        pages.append(page)
        if following is None:
            return pages
        assert len(pages) < 50, "the pages never end"
        listing = listing._replace(after=listing_of(after=following).after)


async def test_pages_over_partitions_list_every_run_once_newest_first(
    client: aioredis.Redis, prefix: str
) -> None:
    """Twelve runs over three partitions, most of them indexed in one of two
    milliseconds (a commit indexes many runs at one time): pages of five, each from
    the last one's position, list each run once, by start then id, newest first; a run
    that starts while the pages are read is not listed (it is newer than the first page)
    and moves nothing."""
    keys = StreamKeys(prefix, partitions=3)
    _, pipeline = load_app(None, {}, {})
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    reader = RunReader(client, keys, pipeline)
    base = now_ms() - 60_000
    runs = {f"run-{n:02d}": base + (0 if n < 5 else 1 if n < 10 else n) for n in range(12)}
    assert len({keys.whole.of(run).partition for run in runs}) == 3
    for run_id, at in runs.items():
        await _index(client, index, run_id, at)
    expected = sorted(runs, key=lambda run: (runs[run], run), reverse=True)

    pages: list[list[RunSummary]] = []
    listing = listing_of(limit=5)
    while True:
        page, following = await list_runs(reader, listing)
        pages.append(page)
        if len(pages) == 1:  # a run started between two pages
            await _index(client, index, "run-late", now_ms())
        if following is None:
            break
        assert following == page[-1].cursor
        listing = listing_of(limit=5, after=following)
    assert [len(page) for page in pages] == [5, 5, 2]
    assert [run.run_id for page in pages for run in page] == expected
    first = pages[0][0]
    assert first.status == RUNNING and first.ended is None and first.cost == {}
    assert first.started == datetime.fromtimestamp(runs[first.run_id] / 1000, UTC)
    assert first.as_dict()["started"].endswith("Z") and first.as_dict()["ended"] is None
    # A page of exactly every run (the late one too): full, so it links on, to an
    # empty page.
    every = await _every_page(reader, listing_of(limit=13))
    assert [len(page) for page in every] == [13, 0]
    assert every[0][0].run_id == "run-late"


async def test_status_and_since_filter_the_listing(client: aioredis.Redis, prefix: str) -> None:
    """With a status, the runs of that status now, by when they got it, newest first,
    paged the same way; ``since`` keeps the runs of the window only."""
    keys = StreamKeys(prefix, partitions=2)
    _, pipeline = load_app(None, {}, {})
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    reader = RunReader(client, keys, pipeline)
    now = now_ms()
    hour = 3_600_000
    await _index(client, index, "old-failed", now - 5 * hour, "failed", now - 4 * hour)
    await _index(client, index, "failed-late", now - 3 * hour, "failed", now - 10_000)
    await _index(client, index, "failed-early", now - 2 * hour, "failed", now - 20_000)
    await _index(client, index, "done", now - 2 * hour, "succeeded", now - 30_000)
    await _index(client, index, "running", now - 10 * hour)
    # A failed run a replay continued to success is in the failed set still: not listed.
    await _index(client, index, "replayed", now - hour, "failed", now - 50_000)
    await _index(client, index, "replayed", now - hour, "succeeded", now - 40_000)

    async def ids(**arguments: object) -> list[str]:
        pages = await _every_page(reader, listing_of(**arguments))  # type: ignore[arg-type]
        return [run.run_id for page in pages for run in page]

    assert await ids(status="failed", limit=1) == ["failed-late", "failed-early", "old-failed"]
    assert await ids(status="failed", since="1h") == ["failed-late", "failed-early"]
    assert await ids(status="succeeded") == ["done", "replayed"]
    assert await ids(status=RUNNING) == ["running"]
    assert await ids(status="no-such-status") == []
    # Every run by its start (a tie by id, descending).
    assert await ids(since=2.5 * 3600, limit=2) == ["replayed", "failed-early", "done"]
    assert len(await ids()) == 6
    failed = (await list_runs(reader, listing_of(status="failed", limit=1)))[0][0]
    assert failed.ended == datetime.fromtimestamp((now - 10_000) / 1000, UTC)


async def test_a_runs_cost_is_the_one_its_own_answer_gives(
    client: aioredis.Redis, prefix: str
) -> None:
    """The cost of a listed run is :func:`run_cost` of the entries ``GET /v1/runs/{id}``
    reads: the page's entries are read together, each run keeping its own."""
    keys = StreamKeys(prefix, partitions=2)
    _, pipeline = load_app(None, {}, {})
    reader = RunReader(client, keys, pipeline)
    runs = Runs(client, keys, pipeline, payload_limit=65536)
    submitted = [(await runs.submit(REQUEST))[0] for _ in range(4)]
    for n, run_id in enumerate(submitted):  # a validator's output with a cost, per run
        part = keys.of(run_id)
        await client.xadd(part.stream("deployment:validated"), {
            "deployment_id": run_id, "producer": "validator", "duration_ms": "3",
            "cost": dumps({"usd": 0.5 * (n + 1)}), "data": dumps({"deployment_id": run_id})})
    page, _ = await list_runs(reader, listing_of())
    assert {run.run_id for run in page} == set(submitted)
    for run in page:
        history, _ = await reader.history(run.run_id)
        assert run.cost == run_cost(pipeline, history)["total"]["cost"]
        assert run.cost == {"usd": 0.5 * (submitted.index(run.run_id) + 1)}
    await runs.close()


@pytest.mark.parametrize(("query", "code"), [
    ({"limit": "0"}, "invalid_limit"), ({"limit": "1001"}, "invalid_limit"),
    ({"limit": "x"}, "invalid_limit"), ({"limit": "-1"}, "invalid_limit"),
    ({"status": ""}, "invalid_status"), ({"status": "a\x07b"}, "invalid_status"),
    ({"status": "s" * 257}, "invalid_status"), ({"since": "soon"}, "invalid_since"),
    ({"since": "-1h"}, "invalid_since"), ({"after": "not-a-cursor"}, "invalid_after"),
    ({"after": "12:"}, "invalid_after"), ({"after": "x:run"}, "invalid_after"),
])
def test_a_bad_argument_is_invalid_input_naming_it(query: dict[str, str], code: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        listing_of_query(query)
    assert [reason.code for reason in caught.value.reasons] == [code]
