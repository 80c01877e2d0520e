"""The run index (printery/runtime/run_index.py, printery/runs/index.py) on a real server: a submit indexes its run
with its entry, a commit of an outcome moves it to its status, a commit of an ingress
entry indexes a run no submit did (a producer's plain XADD), and the cost minutes sum
the last hour only. Pages read the index in bounded round trips whatever its size."""

from __future__ import annotations

from functools import partial

import pytest
import redis.asyncio as aioredis

from printery import ConsumerSettings, Message, Output, Pipeline
from printery.base._json import dumps
from printery.runs.apps import load_app
from printery.runs.facade import Runs
from printery.runs.history import id_order
from printery.runs.index import RunIndexReader
from printery.runtime.run_index import RUNNING, RunIndex, RunMark, committed, now_ms
from printery.store import run_index as index_reads
from printery.testing import wait_for
from printery.transport.commit import Append, Committer, EntryCommit
from printery.wire.keys import StreamKeys
from support.spine import running_pipeline

REQUEST = {"service": "billing-api", "version": "1.0.0", "environment": "development",
           "requested_by": "alice", "notify": ["log"]}


async def test_submit_outcome_and_raw_runs_are_indexed(client: aioredis.Redis, prefix: str) -> (
    None
):
    keys = StreamKeys(prefix)
    _, pipeline = load_app(None, {}, {})
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    reads = RunIndexReader(index.keys)
    runs = Runs(client, keys, pipeline, payload_limit=65536)
    first, entry = await runs.submit(REQUEST)
    # A run id after any generated one: two runs started in one millisecond tie on their
    # score, and the index orders a tie by run id, so "newest first" holds either way.
    second, _ = await runs.submit(REQUEST, run_id=f"{first}-next")
    [again, _] = await runs.submit(REQUEST, run_id=first)  # the same run: indexed once
    assert again == first
    rows, total = await reads.page(client)
    assert total == 2 and [r["run_id"] for r in rows] == [second, first]  # newest first
    assert rows[1] == {"run_id": first, "status": RUNNING, "started": id_order(entry)[0],
                       "ended": 0}
    assert (await reads.summary(client))["running"] == 2

    # The outcome's commit (as the aggregator's): the run moves to its status.
    finished = dumps({"deployment_id": first, "status": "failed", "reasons": []})
    commit = EntryCommit("", "", "", "", [Append(keys.stream("deployment:finished"),
                                                 {"data": finished, "deployment_id": first})],
                         mark=index.mark(keys.stream("health:checked"), first,
                                         [(keys.stream("deployment:finished"), {"data": finished})],
                                         {"usd": 0.5}))
    # A raw XADD's run, indexed by the commit of its ingress entry (no submit record).
    raw = EntryCommit("", "", "", "", [],
                      mark=index.mark(keys.stream("deployment:started"), "dep-raw", [], {"usd": 0.25}))
    # As a worker's committer does: the marks of a script run's entries written together.
    committer = Committer(client, index_key=keys.idempotency_index("w"), group="w",
                          ttl_ms=60_000, index_writes=partial(committed, index))
    assert [r for r in await committer.commit([commit, raw])] == [2, 1]
    await committer.close()
    failed, total = await reads.page(client, status="failed")
    assert total == 1 and failed[0]["run_id"] == first and failed[0]["ended"] > 0
    running, _ = await reads.page(client, status=RUNNING)
    assert {r["run_id"] for r in running} == {second, "dep-raw"}
    assert (await reads.summary(client))["statuses"] == ["failed", RUNNING]
    assert [r["run_id"] for r in await reads.find(client, "dep-raw")] == ["dep-raw"]
    assert await reads.find(client, "dep-nope") == []
    assert await reads.cost_last_hour(client) == {"usd": 0.75}
    await runs.close()


async def test_the_marks_of_one_script_run_are_written_together(
    client: aioredis.Redis, prefix: str
) -> None:
    """A commit of many entries indexes their runs with a few commands, one ZADD per set
    for all of them, and leaves the index as the entries' own writes one by one would:
    started runs running, ended ones under their status (``data.status``, else the
    outcome's type), a run one entry both starts and ends ended."""
    keys = StreamKeys(prefix)
    index = RunIndex(keys, ingress=["start"], outcomes=["done", "gave_up"])
    reads = RunIndexReader(index.keys)
    start, done, gave_up = keys.stream("start"), keys.stream("done"), keys.stream("gave_up")
    succeeded = {"data": dumps({"status": "succeeded"})}
    marks = [index.mark(start, "r1", []), index.mark(start, "r2", []),
             index.mark(keys.stream("middle"), "r1", [(done, succeeded)]),
             index.mark(keys.stream("middle"), "r3", [(gave_up, {"data": "{}"})]),
             index.mark(start, "r4", [(done, succeeded)]),
             index.mark(keys.stream("middle"), "r5", [(keys.stream("other"), {})])]
    assert marks[-1] is None  # neither an ingress entry nor an outcome: nothing to index
    writes = index.writes([mark for mark in marks if mark is not None])
    # 2 ZADDs of the started, ZADD + ZREM of the ended, a ZADD per status, one SADD, an
    # HSET per ended run: 10 commands for 5 marks, against 2 + 5 per mark one by one.
    assert len(writes) == 2 + 2 + 2 + 1 + 3, writes
    # The commit ends a run only with the outcome it keeps: each mark's outputs go with it.
    outputs = [[], [], [(done, succeeded)], [(gave_up, {"data": "{}"})], [(done, succeeded)],
               [(keys.stream("other"), {"data": "{}"})]]
    commits = [EntryCommit("", "", "", "", [Append(*out) for out in outs], mark=mark)
               for mark, outs in zip(marks, outputs, strict=True)]
    committer = Committer(client, index_key=keys.idempotency_index("w"), group="w",
                          ttl_ms=60_000, index_writes=partial(committed, index))
    assert await committer.commit(commits) == [1 + len(outs) for outs in outputs]
    await committer.close()
    rows, total = await reads.page(client, count=10)
    assert total == 4
    assert {row["run_id"]: row["status"] for row in rows} == {
        "r1": "succeeded", "r2": RUNNING, "r3": "gave_up", "r4": "succeeded"}
    assert all(row["ended"] > 0 for row in rows if row["status"] != RUNNING)
    assert await reads.summary(client) == {
        "runs": 4, "running": 1, "statuses": ["gave_up", RUNNING, "succeeded"]}
    succeeded_rows, count = await reads.page(client, status="succeeded")
    assert count == 2 and {row["run_id"] for row in succeeded_rows} == {"r1", "r4"}


async def test_the_costs_handlers_report_reach_the_minute_summed_per_commit(
    client: aioredis.Redis, prefix: str
) -> None:
    """A worker's commits carry their entries' costs to the minute as one sum each:
    whatever the batches, the minute holds exactly what the handlers reported."""
    keys = StreamKeys(prefix)
    p = Pipeline("spend", ingress=["job"], cost_units=["usd", "tokens"])

    @p.step("work", consumes=["job"], produces=["done"], cost_units=["usd", "tokens"])
    async def work(message: Message) -> Output:
        message.report_cost("usd", 0.25)
        message.report_cost("tokens", message.data["n"])
        return Output("done", {})

    for n in range(200):  # a backlog: read, and so committed, many at a time
        await client.xadd(keys.stream("job"), {"data": dumps({"n": n}), "correlation_id": f"r{n}"})
    async def done() -> bool:
        return await client.xlen(keys.stream("done")) == 200

    async with running_pipeline(p, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        await wait_for(done, timeout=20)
    assert await RunIndexReader(keys).cost_last_hour(client) == {"usd": 50.0, "tokens": 19900.0}


async def test_cost_last_hour_counts_sixty_minutes(client: aioredis.Redis, prefix: str) -> None:
    index = RunIndex(StreamKeys(prefix))
    reads = RunIndexReader(index.keys)
    now = now_ms()
    for minutes_ago, amount in ((0, 1.0), (59, 2.0), (60, 4.0), (90, 8.0)):
        for command in index.spent({"tokens": amount}, now - minutes_ago * 60_000):
            await client.execute_command(*command)
    assert await reads.cost_last_hour(client, now) == {"tokens": 3.0}
    assert 0 < await client.ttl(StreamKeys(prefix).cost_minute(now // 60_000)) <= 7200


async def test_with_partitions_each_run_is_indexed_in_its_partition_and_read_merged(
    client: aioredis.Redis, prefix: str
) -> None:
    """docs/reference.md, Partitions: the index writes of a commit stay in the run's
    partition (one slot), and the pages merge every partition newest first."""
    keys = StreamKeys(prefix, partitions=3)
    _, pipeline = load_app(None, {}, {})
    index = RunIndex(keys, ingress=pipeline.ingress, outcomes=pipeline.outcomes)
    reads = RunIndexReader(index.keys)
    runs = Runs(client, keys, pipeline, payload_limit=65536)
    submitted = [(await runs.submit(REQUEST))[0] for _ in range(9)]
    assert len({keys.locate(keys.of(run).stream("x"))[0] for run in submitted}) > 1
    head, total = await reads.page(client, count=4)
    tail, _ = await reads.page(client, offset=4, count=10)
    rows = head + tail
    assert total == 9 and sorted(r["run_id"] for r in rows) == sorted(submitted)
    starts = [r["started"] for r in rows]  # newest first across partitions (ms: ties)
    assert starts == sorted(starts, reverse=True) and len(head) == 4

    first = submitted[0]
    part = keys.of(first)
    finished = dumps({"deployment_id": first, "status": "failed", "reasons": []})
    within = index.within(part)
    mark = within.mark(part.stream("health:checked"), first,
                       [(part.stream("deployment:finished"), {"data": finished})], {"usd": 0.5})
    assert mark is not None
    scope = part.scope + ":"
    assert all(command[1].startswith(scope) for command in within.writes([mark]))
    committer = Committer(client, index_key=part.idempotency_index("w"), group="w",
                          ttl_ms=60_000, index_writes=partial(committed, within))
    assert await committer.commit([EntryCommit("", "", "", "", [Append(
        part.stream("deployment:finished"), {"data": finished})], mark=mark)]) == [2]
    await committer.close()
    failed, total = await reads.page(client, status="failed")
    assert total == 1 and failed[0]["run_id"] == first
    summary = await reads.summary(client)
    assert (summary["runs"], summary["running"], summary["statuses"]) == (
        9, 8, ["failed", RUNNING])
    assert [r["run_id"] for r in await reads.find(client, first)] == [first]
    assert await reads.cost_last_hour(client) == {"usd": 0.5}
    await runs.close()


async def test_the_retention_sweep_forgets_runs_whose_outcome_is_old(
    client: aioredis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run goes from the index (every set, its info hash) once its latest outcome is
    older than the retention, in every partition and however many there are (a batch per
    script call); a running run stays however old, and a run that ended again since keeps
    its newer outcome."""
    monkeypatch.setattr(index_reads, "FORGET_BATCH", 2)  # several calls for the five below
    keys = StreamKeys(prefix, 2)
    index = RunIndex(keys)
    reads = RunIndexReader(index.keys)
    now, hours_ago = now_ms(), now_ms() - 10 * 3600_000

    async def write(run_id: str, *commands: tuple[object, ...]) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            await pipe.execute()

    def of(run_id: str) -> RunIndex:
        return index.within(keys.of(run_id))

    def marked(run_id: str, at_ms: int, *, started: bool = False, status: str = "") -> (
        list[tuple[object, ...]]
    ):
        return of(run_id).writes([RunMark(run_id, started, status)], at_ms)

    old = [f"old-{n}" for n in range(5)]
    for run_id in old:
        await write(run_id, *marked(run_id, hours_ago, started=True, status="succeeded"))
    await write("stuck", *marked("stuck", hours_ago, started=True))
    await write("recent", *marked("recent", now, started=True, status="failed"))
    await write("again", *marked("again", hours_ago, started=True, status="failed"),
                *marked("again", now, status="succeeded"))

    assert await reads.forget_ended(client, retention_s=3600) == len(old)
    rows, total = await reads.page(client)
    assert total == 3 and {row["run_id"] for row in rows} == {"stuck", "recent", "again"}
    assert [row["run_id"] for row in (await reads.page(client, status="failed"))[0]] == ["recent"]
    assert [row["run_id"] for row in (await reads.page(client, status="succeeded"))[0]] == ["again"]
    assert [row["run_id"] for row in (await reads.page(client, status=RUNNING))[0]] == ["stuck"]
    for run_id in old:
        assert not await client.exists(keys.of(run_id).run_info(run_id))
    assert await client.hget(keys.of("again").run_info("again"), "status") == "succeeded"
    assert await reads.forget_ended(client, retention_s=3600) == 0  # idempotent
