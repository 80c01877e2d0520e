"""Budgets in the commit transaction (docs/reference.md, Budgets) against a real server: a
run's spent grows with exactly the entries that commit (never a fenced one, a duplicate or
a retried reply), and the soft warning is written by the commit that reaches it, once; the
run's cost from its entries agrees with it."""

from __future__ import annotations

from functools import partial
from typing import Any

import redis.asyncio as aioredis

from printery import Pipeline
from printery.base import _json
from printery.runs.cost import cost_summary
from printery.runtime.run_index import RunIndex, committed
from printery.transport.commit import (
    FENCED,
    SPENT_MAX,
    SPENT_SCALE,
    Append,
    BudgetCharge,
    ChargePlan,
    Committer,
    EntryCommit,
    decode_spent,
    encode_amount,
)
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys, record_set

TTL_MS = 60_000


def _charge(keys: StreamKeys, run: str, usd: float, tokens: int = 0) -> BudgetCharge:
    note = '{"status": "budget_warning", "unit": "usd", "limit": 10.0, "soft": 0.8, "spent": '
    warning = {"data": "", "type": "budget:warning", "event_id": "evt-w", "cid": "",
               "idempotency_key": "", "producer": "step"}
    plan = ChargePlan(keys.budget_prefix, ("usd", "tokens"), (8.0, None), (note, ""), "cid",
                      keys.stream("budget:warning"), warning)
    return BudgetCharge(plan, run, (encode_amount(usd), encode_amount(tokens)))


async def _spent(client: aioredis.Redis, keys: StreamKeys, run: str) -> dict[str, float]:
    """The units ``run`` spent, from its budget hash (not its other fields)."""
    held = await client.hgetall(keys.budget(run))
    return {unit: decode_spent(held[unit]) for unit in ("usd", "tokens") if unit in held}


async def _read(client: aioredis.Redis, stream: str, n: int) -> list[str]:
    """``n`` entries added to ``stream`` and read by consumer ``c`` of group ``g``: their ids."""
    await ensure_group(client, stream, "g")
    for k in range(n):
        await client.xadd(stream, {"data": str(k)})
    ((_, read),) = await client.xreadgroup("g", "c", {stream: ">"}, count=n)
    return [entry_id for entry_id, _ in read]


async def test_spent_counts_only_what_commits_and_the_warning_is_written_once(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    ids = await _read(client, stream, 7)
    await client.xclaim(stream, "g", "other", 0, [ids[1]])  # fenced out
    await client.hset(index, mapping={"gen": 1, "start": 2**52})
    await client.sadd(record_set(index, 1), "k2")  # already recorded: a duplicate

    def entry(n: int, usd: float) -> EntryCommit:
        return EntryCommit(stream, "c", ids[n], f"k{n}", [Append(out, {"data": str(n)})],
                           _charge(keys, "r1", usd, tokens=100))

    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    try:
        first = [entry(0, 3), entry(1, 3), entry(2, 3), entry(3, 3)]
        results: list[Any] = await committer.commit(first)
        assert results == [2, FENCED, 0, 2]
        assert await _spent(client, keys, "r1") == {"usd": 6, "tokens": 200}
        # The reply was lost and the same commit is sent again: nothing more is charged.
        assert await committer.commit(first) == [FENCED] * 4
        assert await _spent(client, keys, "r1") == {"usd": 6, "tokens": 200}
        # 6 -> 9 reaches the soft threshold (8): that entry's commit writes the warning
        # (its result counts it); 9 -> 12 does not write another.
        assert await committer.commit([entry(4, 3), entry(5, 3)]) == [3, 2]
        assert await committer.commit([entry(6, 0.5)]) == [2]
    finally:
        await committer.close()
    assert await _spent(client, keys, "r1") == {"usd": 12.5, "tokens": 500}
    assert await client.hget(keys.budget("r1"), "usd") == "12500000000", "whole billionths"
    assert 0 < await client.pttl(keys.budget("r1")) <= 2 * TTL_MS
    warnings = await client.xrange(keys.stream("budget:warning"))
    assert len(warnings) == 1
    (_, fields), = warnings
    assert _json.loads(fields["data"]) == {"status": "budget_warning", "unit": "usd",
                                           "limit": 10.0, "soft": 0.8, "spent": 9}
    assert fields["cid"] == "r1" and fields["idempotency_key"] == "budget:warning:r1:usd"
    assert fields["type"] == "budget:warning" and fields["producer"] == "step"
    assert [f["data"] for _, f in await client.xrange(out)] == ["0", "3", "4", "5", "6"]


async def test_the_commit_that_reaches_a_hard_limit_names_the_run_for_the_check(
    client: aioredis.Redis, prefix: str
) -> None:
    """The check before handlers reads only the runs in ``budgets_over``: the commit that
    takes a run's field to its hard limit puts the run there (scored by when its budget
    hash lapses at the latest), a run under every limit is never there, and a member
    whose hash has lapsed goes as another is added."""
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    ids = await _read(client, stream, 3)
    plan = _charge(keys, "", 0).plan._replace(hard=(5.0, None), over=keys.budgets_over)
    await client.zadd(keys.budgets_over, {"lapsed": 1})  # a run whose hash is long gone

    def entry(n: int, run: str, usd: float) -> EntryCommit:
        return EntryCommit(stream, "c", ids[n], f"k{n}", [Append(out, {"data": str(n)})],
                           BudgetCharge(plan, run, (encode_amount(usd), encode_amount(50))))

    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    try:
        assert await committer.commit([entry(0, "r1", 4.5), entry(1, "r2", 4)]) == [2, 2]
        assert await client.zrange(keys.budgets_over, 0, -1) == ["lapsed"]
        (now_s, _) = await client.time()
        assert await committer.commit([entry(2, "r1", 0.5)]) == [2]  # r1: 4.5 -> 5.0
    finally:
        await committer.close()
    members = await client.zrange(keys.budgets_over, 0, -1, withscores=True)
    assert [member for member, _ in members] == ["r1"]  # no limit on tokens: 150 is nothing
    ((_, score),) = members
    assert now_s * 1000 <= score <= (now_s + 2) * 1000 + 2 * TTL_MS
    assert 0 < await client.pttl(keys.budgets_over) <= 2 * TTL_MS


async def test_a_count_past_the_most_a_field_holds_stops_there_and_the_commit_lands(
    client: aioredis.Redis, prefix: str
) -> None:
    """A field counts whole billionths in a 64-bit integer: an add that would pass the
    most it holds leaves it at that most (the run is over any limit) instead of failing
    the commit of every entry in the transaction."""
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    ids = await _read(client, stream, 2)
    plan = _charge(keys, "", 0).plan._replace(hard=(5.0, None), over=keys.budgets_over)
    await client.hset(keys.budget("big"), "usd", str(SPENT_MAX - 1))

    def entry(n: int, run: str) -> EntryCommit:
        return EntryCommit(stream, "c", ids[n], f"k{n}", [Append(out, {"data": str(n)})],
                           BudgetCharge(plan, run, (encode_amount(1.5), encode_amount(0))))

    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    try:
        # "big" passes the soft threshold too: its commit writes the warning.
        assert await committer.commit([entry(0, "big"), entry(1, "small")]) == [3, 2]
    finally:
        await committer.close()
    assert await client.hget(keys.budget("big"), "usd") == str(SPENT_MAX)
    assert await _spent(client, keys, "small") == {"usd": 1.5}
    assert await client.zrange(keys.budgets_over, 0, -1) == ["big"]
    assert await client.xlen(out) == 2
    ((_, warning),) = await client.xrange(keys.stream("budget:warning"))
    assert _json.loads(warning["data"])["spent"] == SPENT_MAX / SPENT_SCALE


def test_amounts_are_whole_billionths_and_stay_within_what_a_field_counts() -> None:
    assert [encode_amount(v) for v in (0, 0.0, 3, 0.25, 0.1 + 0.2, 1e-9, 4e-10)] == [
        "0", "0", "3000000000", "250000000", "300000000", "1", "0"]
    assert encode_amount(-0.5) == "-500000000"
    assert encode_amount(float("nan")) == "0"
    assert encode_amount(float("inf")) == encode_amount(10**12) == str(SPENT_MAX)
    assert encode_amount(-1e300) == str(-SPENT_MAX)
    assert [decode_spent(v) for v in (None, "", "0", "12500000000", "2.5")] == [
        0, 0, 0, 12.5, 0]


async def test_a_fenced_or_duplicate_commit_counts_once_in_the_cost_as_in_spent(
    client: aioredis.Redis, prefix: str
) -> None:
    """A redelivered entry whose first delivery's commit was fenced out, and an entry
    whose key was recorded already (a duplicate): the run's cost from its entries
    (``cost_summary``, the one rule of every figure) is the budget's spent, call for call."""
    pipeline = Pipeline("fenced-cost", ingress=["in"], cost_units=["usd"],
                        correlation_field="cid")
    pipeline.step("step", consumes=["in"], produces=["out"], cost_units=["usd"])(
        lambda msg: None)
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    ids = await _read(client, stream, 2)

    def entry(n: int, entry_id: str, consumer: str = "c", key: str = "") -> EntryCommit:
        fields = {"data": str(n), "producer": "step", "duration_ms": "1.000", "cid": "r1",
                  "cost": _json.dumps({"usd": 2})}
        return EntryCommit(stream, consumer, entry_id, key or f"k{n}", [Append(out, fields)],
                           _charge(keys, "r1", 2))

    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    try:
        await client.xclaim(stream, "g", "other", 0, [ids[1]])  # c's commit is fenced out
        assert await committer.commit([entry(0, ids[0]), entry(1, ids[1])]) == [2, FENCED]
        assert await committer.commit([entry(1, ids[1], consumer="other")]) == [2]
        again = await client.xadd(stream, {"data": "0"})  # the producer sent entry 0 twice
        await client.xreadgroup("g", "c", {stream: ">"}, count=1)
        assert await committer.commit([entry(0, again, key="k0")]) == [0]
    finally:
        await committer.close()
    summary = await cost_summary(client, keys, pipeline, "r1")
    assert summary["steps"]["step"]["calls"] == 2
    assert summary["total"]["cost"] == await _spent(client, keys, "r1") == {"usd": 4}


async def test_a_call_whose_outcome_is_withheld_still_counts_what_it_spent(
    client: aioredis.Redis, prefix: str
) -> None:
    """An entry admitted while its run was under budget commits after another branch
    ended the run: its outcome is withheld (a run gets one outcome), its cost is charged
    (it was spent), and a copy of its figures in the run's ``withheld`` stream keeps the
    run's cost from its entries equal to the budget's spent; a second output of the call
    that is no outcome is written, and is not counted twice."""
    pipeline = Pipeline("withheld-cost", ingress=["in"], outcomes=["end"], cost_units=["usd"],
                        correlation_field="cid")
    pipeline.step("step", consumes=["in"], produces=["end", "note"], cost_units=["usd"])(
        lambda msg: None)
    keys = StreamKeys(prefix)
    index = RunIndex(keys, outcomes=["end"])
    stream, group_index = keys.stream("in"), keys.idempotency_index("g")
    ids = await _read(client, stream, 3)

    def entry(n: int, *types: str) -> EntryCommit:
        appends = [Append(keys.stream(t), {
            "data": _json.dumps({"status": f"s{n}"}), "type": t, "producer": "step",
            "duration_ms": "1.000", "cid": "r1", "cost": _json.dumps({"usd": n}),
            "event_id": f"e{n}{t}", **({"call_of": f"e{n}{types[0]}"} if k else {})})
            for k, t in enumerate(types)]
        return EntryCommit(stream, "c", ids[n], f"k{n}", appends, _charge(keys, "r1", n),
                           mark=index.mark(stream, "r1", appends))

    committer = Committer(client, index_key=group_index, group="g", ttl_ms=TTL_MS,
                          index_writes=partial(committed, index))
    try:
        assert await committer.commit([entry(1, "end")]) == [2]  # ends the run
        assert await committer.commit([entry(2, "end", "note")]) == [2]  # its note only
        assert await committer.commit([entry(0, "end")]) == [1]  # spent nothing
    finally:
        await committer.close()
    assert [f["event_id"] for _, f in await client.xrange(keys.stream("end"))] == ["e1end"]
    assert await client.xlen(keys.stream("note")) == 1
    copies = [f for _, f in await client.xrange(keys.withheld)]
    assert [(f["event_id"], f["withheld"], f["data"]) for f in copies] == [
        ("e2end", "run_ended", "{}"), ("e0end", "run_ended", "{}")]
    summary = await cost_summary(client, keys, pipeline, "r1")
    assert summary["steps"]["step"]["calls"] == 3
    assert summary["total"]["cost"] == await _spent(client, keys, "r1") == {"usd": 3}
