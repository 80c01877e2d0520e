"""The contracts of ``printery.transport`` (docs/reference.md, Failures; Streams and
entries), each written once and run on a single server and on a cluster: the commit is
atomic per entry, fenced by ownership and idempotent through its record; a lease keeps an
entry from a claim and a hand-back gives it up; records are found in one round trip; the
channel pipelines many transactions, commands and scripts and answers each in order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from printery.transport.channel import DirectChannel
from printery.transport.commit import DUPLICATE, FENCED, Append, Committer, EntryCommit
from printery.transport.records import RecordLookup
from printery.transport.scripts import Script
from printery.transport.streams import Leases, claim_idle, ensure_group, pending_holders
from support.backends import Backend

TTL_MS = 60_000
GROUP = "g"


async def _commit(backend: Backend, entries: Sequence[EntryCommit]) -> list[Any]:
    committer = Committer(backend.client, index_key=backend.keys.idempotency_index(GROUP),
                          group=GROUP, ttl_ms=TTL_MS)
    try:
        return await committer.commit(entries)
    finally:
        await committer.close()


async def _read(backend: Backend, count: int, consumer: str = "c") -> tuple[str, list[str]]:
    """``count`` new entries of ``in`` (written now), pending to ``consumer``: the stream and their ids."""
    stream = backend.keys.stream("in")
    await ensure_group(backend.client, stream, GROUP)
    for n in range(count):
        await backend.client.xadd(stream, {"data": f'{{"n": {n}}}'})
    ((_, entries),) = await backend.client.xreadgroup(GROUP, consumer, {stream: ">"}, count=count)
    return stream, [entry_id for entry_id, _ in entries]


async def _pending(backend: Backend, stream: str) -> list[str]:
    rows = await backend.client.xpending_range(stream, GROUP, min="-", max="+", count=100)
    return [row["message_id"] for row in rows]


async def _data(backend: Backend, stream: str) -> list[str]:
    return [fields["data"] for _, fields in await backend.client.xrange(stream)]


async def test_a_commit_writes_acks_and_records_each_entry(backend: Backend) -> None:
    stream, ids = await _read(backend, 3)
    out = backend.keys.stream("out")
    results = await _commit(backend, [
        EntryCommit(stream, "c", entry_id, f"k{n}", [Append(out, {"data": str(n)})])
        for n, entry_id in enumerate(ids)])
    assert results == [2, 2, 2], "1 + the outputs kept, for each entry"
    assert await _data(backend, out) == ["0", "1", "2"]
    assert await _pending(backend, stream) == [], "every entry acked"
    lookup = RecordLookup(DirectChannel(backend.client), backend.keys.idempotency_index(GROUP))
    try:
        assert await lookup.recorded(["k0", "k1", "k2", "never"]) == [True, True, True, False]
    finally:
        await lookup.close()


async def test_an_entry_that_cannot_commit_writes_none_of_its_outputs(backend: Backend) -> None:
    """Atomic per entry: one output on a key of another type fails that entry, its other
    output is withdrawn, it stays pending and unrecorded; the entry beside it commits."""
    stream, ids = await _read(backend, 2)
    ok, blocked = backend.keys.stream("ok"), backend.keys.stream("blocked")
    await backend.client.set(blocked, "not a stream")
    failed, committed = await _commit(backend, [
        EntryCommit(stream, "c", ids[0], "a", [Append(ok, {"data": "1"}), Append(blocked, {"data": "2"})]),
        EntryCommit(stream, "c", ids[1], "b", [Append(ok, {"data": "3"})]),
    ])
    assert isinstance(failed, Exception) and "WRONGTYPE" in str(failed)
    assert committed == 2
    assert await _data(backend, ok) == ["3"]
    assert await _pending(backend, stream) == [ids[0]]


async def test_a_commit_of_an_entry_another_consumer_holds_is_fenced(backend: Backend) -> None:
    stream, ids = await _read(backend, 2)
    out = backend.keys.stream("out")
    await backend.client.xclaim(stream, GROUP, "other", 0, [ids[0]])
    results = await _commit(backend, [
        EntryCommit(stream, "c", entry_id, f"k{n}", [Append(out, {"data": str(n)})])
        for n, entry_id in enumerate(ids)])
    assert results == [FENCED, 2]
    assert await _data(backend, out) == ["1"], "nothing written for the fenced entry"
    assert await _pending(backend, stream) == [ids[0]], "still the other consumer's"


async def test_a_commit_sent_again_writes_nothing_twice(backend: Backend) -> None:
    """Idempotent: a second entry with a recorded key is a duplicate (acked, unwritten), and
    the same commit sent again (its reply lost) is fenced, its outputs withdrawn."""
    stream, ids = await _read(backend, 2)
    out = backend.keys.stream("out")
    first = [EntryCommit(stream, "c", ids[0], "same", [Append(out, {"data": "first"})])]
    assert await _commit(backend, first) == [2]
    again = [EntryCommit(stream, "c", ids[1], "same", [Append(out, {"data": "second"})])]
    assert await _commit(backend, again) == [DUPLICATE]
    assert await _commit(backend, first) == [FENCED]
    assert await _data(backend, out) == ["first"]
    assert await _pending(backend, stream) == []


async def test_an_output_with_a_once_key_is_written_once_ever(backend: Backend) -> None:
    stream, ids = await _read(backend, 2)
    out = backend.keys.stream("out")
    once = backend.keys.once("notify")
    results = await _commit(backend, [
        EntryCommit(stream, "c", entry_id, f"k{n}", [Append(out, {"data": str(n)}, once)])
        for n, entry_id in enumerate(ids)])
    assert results == [2, 1], "the second entry committed, its once-guarded output not kept"
    assert await _data(backend, out) == ["0"]


async def test_a_lease_keeps_an_entry_from_a_claim_and_a_hand_back_gives_it_up(backend: Backend) -> None:
    stream, ids = await _read(backend, 2)
    leases = Leases(backend.client, GROUP)
    # Both idle now: a claim of entries idle past 0 ms would take them. Renewed, the idle
    # time starts again: a claim of entries idle past a minute takes none.
    await leases.renew(stream, "c", ids)
    assert await claim_idle(backend.client, stream, GROUP, "taker", 60_000, 10) == []
    # Renewing an entry another consumer holds does nothing: its lease is not ours.
    await backend.client.xclaim(stream, GROUP, "other", 0, [ids[1]])
    await leases.hand_back(stream, "c", ids, idle_ms=120_000)
    claimed = await claim_idle(backend.client, stream, GROUP, "taker", 60_000, 10)
    assert [entry_id for entry_id, _ in claimed] == [ids[0]], "only ours was handed back"
    count, holders = await pending_holders(backend.client, stream, GROUP)
    assert (count, sorted(holders)) == (2, ["other", "taker"])
    assert await leases.redeliver(stream, "c", ids[0]) == -1, "no longer ours"


_INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
INCR_LUA = Script("contract-incr", _INCR, hashlib.sha1(_INCR.encode()).hexdigest())


async def test_the_channel_pipelines_many_calls_and_answers_each_in_order(backend: Backend) -> None:
    """Transactions, commands and scripts, many in one write over every partition (each
    to its master on the cluster): each reply in the order asked, an error in its place."""
    keys = [backend.whole.at(n % backend.whole.partitions).stream(f"count{n}") for n in range(30)]
    channel = DirectChannel(backend.client)
    try:
        replies = await channel.transactions(
            [[("MULTI",), ("INCRBY", key, n), ("SET", f"{key}:seen", "1"), ("EXEC",)]
             for n, key in enumerate(keys)])
        assert replies == [[n, "OK"] for n in range(len(keys))]
        assert await channel.scripts(INCR_LUA, [([key], [1]) for key in keys]) == [
            n + 1 for n in range(len(keys))]
        await backend.client.set(backend.keys.stream("text"), "x")
        got = await channel.commands([("GET", keys[2]), ("INCR", backend.keys.stream("text")),
                                      ("GET", keys[7])])
        assert got[0] == "3" and got[2] == "8"
        assert isinstance(got[1], Exception), "an error in its own place, the others answered"
    finally:
        await channel.close()
