"""The commit transaction (transport/commit.py + commit.lua) against a real server:
outputs are appended by plain XADDs in a MULTI, and the script keeps or withdraws each
entry's outputs. What a reader can see afterwards is exactly the outputs of the entries
that committed, in order, whatever else the run held. And the argument encoding: what
the Python half writes is what the script's own parser reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from printery.base import _json
from printery.runtime.run_index import RunMark
from printery.transport.channel import DirectChannel
from printery.transport.commit import (
    ARGUMENTS_PARSED,
    COMMIT_LUA,
    COMMIT_SCRIPT,
    DUPLICATE,
    FENCED,
    SPENT_SCALE,
    Append,
    BudgetCharge,
    ChargePlan,
    Committer,
    DeadLetterWrite,
    EntryCommit,
    IndexEnd,
    IndexWrites,
    commit_commands,
    commit_results,
    commit_run,
    encode_amount,
    index_errors,
)
from printery.transport.dead_letter import write_dead_letter
from printery.transport.scripts import Scripts
from printery.transport.streams import ensure_group
from printery.wire.keys import StreamKeys, record_set, record_sets

TTL_MS = 60_000


async def _commit(client: aioredis.Redis, index: str, entries: Sequence[EntryCommit]) -> list[Any]:
    """Each entry's result, through the one commit API."""
    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)
    try:
        return await committer.commit(entries)
    finally:
        await committer.close()


async def _fill(client: aioredis.Redis, stream: str, count: int) -> None:
    """Group ``g`` on ``stream``, and ``count`` entries in it."""
    await ensure_group(client, stream, "g")
    for n in range(count):
        await client.xadd(stream, {"data": f'{{"n": {n}}}'})


async def _read(client: aioredis.Redis, stream: str, consumer: str, count: int) -> list[str]:
    """Ids of the next ``count`` entries, now pending to ``consumer``."""
    ((_, entries),) = await client.xreadgroup("g", consumer, {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in entries]


async def test_one_run_keeps_only_what_commits_and_a_replay_writes_nothing(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 5)
    ids = await _read(client, stream, "c", 5)
    # Entry 1 now belongs to another consumer; entry 2's record exists already; entry 3
    # has two outputs, the second guarded by a once key that is already taken.
    await client.xclaim(stream, "g", "other", 0, [ids[1]])
    await client.hset(index, mapping={"gen": 1, "start": 2**52})
    await client.sadd(record_set(index, 1), "k2")
    await client.set(keys.once("taken"), "1")

    def call(n: int, *extra: Append) -> EntryCommit:
        return EntryCommit(stream, "c", ids[n], f"k{n}",
                           [Append(out, {"data": f'{{"n": {n}}}'}), *extra])

    entries = [
        call(0), call(1), call(2),
        call(3, Append(out, {"data": '{"n": "3b"}'}, keys.once("taken"))),
        call(4),
    ]
    assert await _commit(client, index, entries) == [2, FENCED, DUPLICATE, 2, 2]
    written = [fields["data"] for _, fields in await client.xrange(out)]
    assert written == ['{"n": 0}', '{"n": 3}', '{"n": 4}']
    pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
    assert [row["message_id"] for row in pending] == [ids[1]], "all but the fenced acked"
    assert await client.smismember(record_set(index, 1), ["k0", "k1", "k3", "k4"]) == [1, 0, 1, 1]

    # The reply was lost and the run is sent again: everything is now fenced (acked)
    # or a duplicate, so its outputs are withdrawn inside the same transaction.
    assert await _commit(client, index, entries) == [FENCED] * 5
    assert [f["data"] for _, f in await client.xrange(out)] == written


async def test_an_output_key_of_another_type_fails_its_entry_alone(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, index = keys.stream("in"), keys.idempotency_index("g")
    await _fill(client, stream, 2)
    ids = await _read(client, stream, "c", 2)
    await client.set(keys.stream("blocked"), "x")
    failed, committed = await _commit(client, index, [
        EntryCommit(stream, "c", ids[0], "a", [Append(keys.stream("ok"), {"data": "1"}),
                                               Append(keys.stream("blocked"), {"data": "2"})]),
        EntryCommit(stream, "c", ids[1], "b", [Append(keys.stream("ok"), {"data": "3"})]),
    ])
    assert isinstance(failed, Exception) and "WRONGTYPE" in str(failed)
    assert committed == 2
    assert [f["data"] for _, f in await client.xrange(keys.stream("ok"))] == ["3"], (
        "the failed entry's other output is withdrawn")
    pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
    assert [row["message_id"] for row in pending] == [ids[0]]
    assert not await client.sismember(record_set(index, 1), "a"), "no record for the failed entry"


async def test_a_run_of_several_segments_commits_each_entry_on_its_own(
    client: aioredis.Redis, prefix: str
) -> None:
    """Entries of two consumers and two source streams, with one, two and no outputs, a
    key twice in the run and a once key: each entry gets its own verdict, and the outputs
    withdrawn are exactly those of the entries that must not commit."""
    keys = StreamKeys(prefix)
    a, b, out, side = (keys.stream(name) for name in ("a", "b", "out", "side"))
    index = keys.idempotency_index("g")
    for stream in (a, b):
        await _fill(client, stream, 4)
    from_a = await _read(client, a, "c1", 2) + await _read(client, a, "c2", 2)
    from_b = await _read(client, b, "c1", 4)
    await client.set(keys.once("taken"), "1")

    def call(stream: str, consumer: str, entry_id: str, key: str, *outputs: Append) -> EntryCommit:
        return EntryCommit(stream, consumer, entry_id, key, outputs)

    def to(stream: str, data: str, once: str = "") -> Append:
        return Append(stream, {"data": data}, once)

    calls = [
        call(a, "c1", from_a[0], "x", to(out, "a0")),
        call(a, "c1", from_a[1], "y", to(out, "a1")),
        call(a, "c2", from_a[2], "x", to(out, "a2")),  # key x again: a duplicate
        call(a, "c2", from_a[3], "z", to(out, "a3"), to(side, "a3s")),
        call(b, "c1", from_b[0], "w", to(side, "b0", keys.once("fresh"))),
        call(b, "c1", from_b[1], "v", to(side, "b1", keys.once("taken"))),
        call(b, "c1", from_b[2], "u"),  # no outputs
        call(b, "c2", from_b[3], "t", to(out, "b3")),  # b3 is c1's: fenced
        EntryCommit("", "", "", "", [to(out, "emitted")]),
    ]
    # Every key the script touches is declared (the cluster routes by them).
    assert set(commit_run(index, "g", TTL_MS, calls).keys) == {
        index, *record_sets(index), a, b, out, side, keys.once("fresh"), keys.once("taken")}
    assert await _commit(client, index, calls) == [2, 2, DUPLICATE, 3, 2, 1, 1, FENCED, 2]
    assert [f["data"] for _, f in await client.xrange(out)] == ["a0", "a1", "a3", "emitted"]
    assert [f["data"] for _, f in await client.xrange(side)] == ["a3s", "b0"]
    for stream, still in ((a, []), (b, [from_b[3]])):
        pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        assert [row["message_id"] for row in pending] == still
    assert sorted(await client.smembers(record_set(index, 1))) == ["u", "v", "w", "x", "y", "z"]
    assert await client.get(keys.once("fresh")) == "1"


async def test_a_clean_run_replies_with_its_count_and_unsorted_ids_are_checked_one_by_one(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 6)
    ids = await _read(client, stream, "c", 6)
    order = [3, 0, 5, 1, 4, 2]  # handlers finished out of order
    run = commit_run(index, "g", TTL_MS, [
        EntryCommit(stream, "c", ids[n], f"k{n}", [Append(out, {"data": str(n)})]) for n in order
    ])
    channel = DirectChannel(client)
    try:
        (executed,) = await channel.transactions([commit_commands(run)])
    finally:
        await channel.close()
    reply = executed[-1]
    assert reply == 6, "every entry committed: the count alone comes back"
    assert commit_results(run, reply) == [2] * 6
    assert [f["data"] for _, f in await client.xrange(out)] == [str(n) for n in order]
    assert (await client.xpending(stream, "g"))["pending"] == 0


#: Appended to commit.lua's argument parser: each entry as the script sees it.
_DECODER = """
local entries = {}
for _, s in ipairs(segs) do
  local l = s.letter
  if l then
    entries[#entries + 1] = {'letter', l.id, l.consumer, l.dlq, l.source or '', l.fields,
      l.outcome or '', l.info or '', l.before or '', l.after or '', l.outcome_fields,
      l.last_error or '', l.once or '', l.once_ttl or '', l.reserved or '', l.reservation or ''}
  end
  for x = 1, (l and 0 or s.n) do
    local outs = {}
    for j = 1, s.m do
      local column, ends = s.once[j], s.ends[j]
      outs[j] = {s.outs[j], column and KEYS[column + x - 1] or '', ends and KEYS[ends + x - 1] or ''}
    end
    local budget = {}
    if s.budget then
      local b, charged = s.budget, {}
      for j, f in ipairs(b.fields) do
        charged[j] = {f.name, ARGV[f.col + x - 1], f.soft or '', f.hard or '', f.note}
      end
      budget = {KEYS[b.hashes + x - 1], b.corr, b.stream, b.over or '',
                b.reserved and KEYS[b.reserved + x - 1] or '', b.scale, b.tpl, charged,
                ARGV[b.runs + x - 1]}
    end
    entries[#entries + 1] = {
      s.stream or '', s.stream and s.consumer or '', s.ids and ARGV[s.ids + x - 1] or '',
      s.marks and ARGV[s.marks + x - 1] or '', outs, budget}
  end
end
return cjson.encode({group, ttl, entries})
"""

_appends = st.lists(st.builds(
    Append, stream=st.sampled_from(["s1", "s2"]), fields=st.just({"data": "{}"}),
    once=st.sampled_from(["", "o1", "o2"])), max_size=3)
_WARNING = {"data": "", "type": "budget:warning", "cid": ""}


@st.composite
def _charges(draw: st.DrawFn) -> BudgetCharge | None:
    """No charge, or one of a few budget shapes (field names, soft thresholds) with
    amounts of their own."""
    shape = draw(st.sampled_from([None, ("usd",), ("usd", "tokens"), ("step:s:usd", "usd")]))
    if shape is None:
        return None
    soft = draw(st.sampled_from([None, 8.0, 0.5]))
    hard = draw(st.sampled_from([(), tuple(draw(st.sampled_from([None, 10.0, 2.5]))
                                         for _ in shape)]))
    # The run's field and the step's of one unit share an amount column, or each has its own.
    columns = draw(st.sampled_from([(), (0, 0)])) if shape == ("step:s:usd", "usd") else ()
    plan = ChargePlan(
        "p:budget:", shape, (soft, *[None] * (len(shape) - 1)),
        ('{"unit": "usd", "spent": ', *[""] * (len(shape) - 1)), "cid", "p:budget:warning",
        _WARNING, hard, draw(st.sampled_from(["", "p:budget-over"])), columns,
        draw(st.sampled_from(["", "p:reserved:"])))
    return BudgetCharge(plan, draw(st.sampled_from(["r1", "r2"])),
                        tuple(encode_amount(draw(st.sampled_from([0, 3, 0.25, 812])))
                              for _ in range(max(columns or range(len(shape))) + 1)))


_entries = st.lists(st.builds(
    EntryCommit, source=st.sampled_from(["in1", "in2"]), consumer=st.sampled_from(["c1", "c2"]),
    entry_id=st.sampled_from(["", "1-0", "2-0", "3-1"]), record=st.sampled_from(["", "k1", "k2"]),
    appends=_appends, budget=_charges(), mark=st.none() | st.builds(
        RunMark, run_id=st.just("r"), started=st.just(False), status=st.just("done"),
        ends=st.sampled_from([(), (0,), (1, 2)]), info=st.sampled_from(["i1", "i2"])),
    letter=st.none() | st.builds(
        DeadLetterWrite, source=st.just("in1"), group=st.just("group"), consumer=st.sampled_from(["", "c1"]),
        entry_id=st.sampled_from(["", "1-0"]), dlq=st.just("dlq"), letter=st.just({"type": "t", "error": "e"}),
        outcome=st.sampled_from(["", "run:failed"]), outcome_fields=st.just({"data": "", "cid": "r"}),
        data_before=st.just('{"a":"'), data_after=st.just('"}'), run_info=st.just("i1"),
        index=st.none(), last_error=st.sampled_from(["", "lasterr"]), once=st.sampled_from(["", "o9"]),
        once_ttl_ms=st.just(5), ends_run=st.booleans(), reserved=st.just("res"),
        reservation=st.sampled_from(["", "k1"])) | st.none()),
    min_size=1, max_size=12)


def _lettered(letter: DeadLetterWrite) -> list[Any]:
    """A dead letter as the decoder shows it."""
    outcome = bool(letter.outcome)
    flat = [part for pair in letter.letter.items() for part in pair]
    fields = [part for pair in letter.outcome_fields.items() for part in pair] if outcome else []
    return ["letter", letter.entry_id, letter.consumer, letter.dlq,
            letter.source if letter.entry_id else "", flat, letter.outcome,
            letter.run_info if outcome else "", letter.data_before if outcome else "",
            letter.data_after if outcome else "", fields or {}, letter.last_error, letter.once,
            str(letter.once_ttl_ms) if letter.once else "",
            letter.reserved if letter.reservation else "", letter.reservation]


def _charged(charge: BudgetCharge | None) -> list[Any]:
    """A charge as the decoder shows it (amounts as sent, thresholds as numbers in the
    hash's scale)."""
    if charge is None:
        return []
    plan = charge.plan
    hard = plan.hard or (None,) * len(plan.fields)
    columns = plan.columns or range(len(plan.fields))
    fields = [[name, str(charge.amounts[column]), "" if soft is None else soft * SPENT_SCALE,
               "" if limit is None else limit * SPENT_SCALE, note]
              for name, column, soft, limit, note in zip(plan.fields, columns, plan.soft,
                                                         hard, plan.notes, strict=True)]
    template = [part for pair in plan.warning.items() for part in pair]
    return [plan.prefix + charge.run, plan.corr, plan.warning_stream, plan.over,
            plan.reserved + charge.run if plan.reserved else "", SPENT_SCALE, template, fields,
            charge.run]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=_entries)
async def test_the_script_parses_exactly_what_the_python_half_encodes(
    client: aioredis.Redis, entries: list[EntryCommit]
) -> None:
    """Any run of entries, encoded by ``commit_run``, is read back by commit.lua's own
    argument parser entry by entry: source, consumer, id, record, outputs, their once keys
    and the run info hash of an outcome output, and the budget charged: hash key, warning layout, reservations prefix, field, amount
    (of its own column or one shared by the fields of a unit), soft threshold."""
    run = commit_run("index", "group", TTL_MS, entries)
    parser = COMMIT_LUA.split(ARGUMENTS_PARSED)[0]
    assert "ARGV" in parser and "segs" in parser
    reply = await client.eval(parser + _DECODER, len(run.keys), *run.keys, *run.args)
    group, ttl, seen = _json.loads(reply)
    assert (group, ttl) == ("group", TTL_MS)
    expected = [
        _lettered(e.letter) if e.letter is not None else
        [e.source if e.entry_id else "", e.consumer if e.entry_id else "", e.entry_id,
         e.record, [[out.stream, out.once, e.mark.info if e.mark and slot in e.mark.ends else ""]
                    for slot, out in enumerate(e.appends)], _charged(e.budget)]
        for e in entries
    ]
    # cjson writes an empty table as an object.
    assert [entry if entry[0] == "letter" else [*entry[:4], entry[4] or [], entry[5] or []]
            for entry in seen] == expected
    assert run.appends == [out for e in entries if e.letter is None for out in e.appends]


async def test_a_commit_after_the_server_forgot_the_script_writes_once(
    client: aioredis.Redis, prefix: str
) -> None:
    """Commits run the script by SHA, loaded by the committer's connection before its
    first commit. A ``SCRIPT FLUSH`` between two commits makes the next transaction's
    ``XADD``s run without it: they are withdrawn, the script loaded again and the commit
    sent again, so every output is written once and every entry acked once."""
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 4)
    ids = await _read(client, stream, "c", 4)
    committer = Committer(client, index_key=index, group="g", ttl_ms=TTL_MS)

    def entry(n: int, key: int | None = None) -> EntryCommit:
        return EntryCommit(stream, "c", ids[n], f"k{n if key is None else key}",
                           [Append(out, {"data": str(n)}), Append(out, {"data": f"{n}b"})])

    try:
        assert await committer.commit([entry(0)]) == [3]
        await client.script_flush()
        assert await committer.commit([entry(1), entry(2)]) == [3, 3]
        await client.script_flush()
        assert await committer.commit([entry(3, key=1)]) == [DUPLICATE], "1's record was written"
    finally:
        await committer.close()
    assert [f["data"] for _, f in await client.xrange(out)] == ["0", "0b", "1", "1b", "2", "2b"]
    assert (await client.xpending(stream, "g"))["pending"] == 0


async def test_a_run_index_write_that_fails_is_returned_and_the_commit_stands(
    client: aioredis.Redis, prefix: str
) -> None:
    """The run index is written by name and its errors come back with the reply (after
    the entries' results): an index key of another type fails no commit."""
    keys = StreamKeys(prefix)
    stream, out, index = keys.stream("in"), keys.stream("out"), keys.idempotency_index("g")
    await _fill(client, stream, 1)
    (entry_id,) = await _read(client, stream, "c", 1)
    await client.set(keys.run_index(), "not a sorted set")
    writes = IndexWrites(1, keys.run_index(), keys.run_index("running"), ("r1",))
    run = commit_run(index, "g", TTL_MS, [EntryCommit(stream, "c", entry_id, "k", [Append(out, {"data": "1"})],
                                                      mark=object())], lambda marks: writes)
    channel = DirectChannel(client, preload=[COMMIT_SCRIPT])
    try:
        (executed,) = await channel.transactions([commit_commands(run)])
    finally:
        await channel.close()
    reply = executed[-1]
    assert index_errors(run, reply) and "WRONGTYPE" in index_errors(run, reply)[0]
    assert commit_results(run, reply) == [2], "the commit stands"
    assert await client.xlen(out) == 1 and (await client.xpending(stream, "g"))["pending"] == 0
    assert await client.zscore(keys.run_index("running"), "r1") == 1, "the other writes made"


async def test_a_dead_letter_alone_is_one_commit_of_its_kind_written_once(
    client: aioredis.Redis, prefix: str
) -> None:
    """An operator's dead letter (no committer): the commit script writes its dlq entry,
    the run:failed naming it, the ack and the index; a retry finds it acked: nothing twice."""
    keys = StreamKeys(prefix)
    stream = keys.stream("in")
    await _fill(client, stream, 1)
    (entry_id,) = await _read(client, stream, "c", 1)
    info = keys.run_info("r1")
    letter = DeadLetterWrite(
        stream, "g", "", entry_id, keys.dlq, {"type": "in", "error": "boom"},
        outcome=keys.stream("run:failed"), outcome_fields={"data": "", "cid": "r1"},
        data_before='{"dlq_id":"', data_after='"}', run_info=info,
        index=IndexWrites(5, keys.run_index(), keys.run_index("running"), (), "", 0, (),
                          keys.run_statuses,
                          (IndexEnd(info, keys.run_index("failed"), "r1", "failed", False),)))
    dlq_id = await write_dead_letter(Scripts(client), letter)
    assert dlq_id is not None
    ((_, failed),) = await client.xrange(keys.stream("run:failed"))
    assert _json.loads(failed["data"]) == {"dlq_id": dlq_id}
    assert (await client.xpending(stream, "g"))["pending"] == 0
    assert await client.hgetall(info) == {"dead_letter": dlq_id, "status": "failed", "ended": "5"}
    assert await write_dead_letter(Scripts(client), letter) is None, "fenced: written once"
    assert await client.xlen(keys.dlq) == 1
