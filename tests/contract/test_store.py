"""The contracts of ``printery.store``'s reads (docs/reference.md, Operator commands;
Partitions), each written once and run on a single server and on a cluster: the stream
overview per event type, partition and group; the count of what waits for people over
every partition; a scan of every partition; entries read by reference and appended
together; the run index's counts and its forgetting, partition by partition."""

from __future__ import annotations

from printery.runs.index import RunIndexReader
from printery.runtime.run_index import RunIndex, RunMark, now_ms
from printery.store import Waiting, read_overview, waiting
from printery.store.scan import append_entries, last_ids, read_entries, scan_partitions
from printery.transport.channel import DirectChannel
from printery.transport.streams import ensure_group
from support.backends import PARTITIONS, Backend


async def _server_ms(backend: Backend) -> int:
    seconds, micros = await backend.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_the_overview_counts_each_partition_and_group(backend: Backend) -> None:
    client, whole = backend.client, backend.whole
    one, two = whole.at(0).stream("work"), whole.at(2).stream("work")
    for stream in (one, two):
        await ensure_group(client, stream, "reader")
    now = await _server_ms(backend)
    await client.xadd(one, {"data": "{}"}, id=f"{now - 30_000}-0")
    await client.xadd(one, {"data": "{}"}, id=f"{now - 20_000}-0")
    await client.xadd(two, {"data": "{}"}, id=f"{now - 5_000}-0")
    await client.xreadgroup("reader", "c", {one: ">"}, count=1)

    overview = await read_overview(client, whole, ["work"])
    by = {s.partition: s for s in overview.streams}
    assert sorted(by) == list(range(PARTITIONS))
    assert (by[0].length, by[1].length, by[2].length) == (2, 0, 1)
    (first,) = by[0].groups
    assert (first.pending, first.undelivered) == (1, 1) and 30.0 <= first.lag_s < 60.0
    (last,) = by[2].groups
    assert (last.pending, last.undelivered) == (0, 1) and 5.0 <= last.lag_s < 35.0
    assert by[1].groups == ()
    assert overview.length("work") == 3
    assert 30.0 <= overview.lags("work")["reader"] < 60.0


async def test_what_waits_for_people_is_counted_over_every_partition(backend: Backend) -> None:
    client, whole = backend.client, backend.whole
    assert await waiting(client, whole) == Waiting(reviews=0, dead_letters=0)
    for n in range(PARTITIONS):
        await client.xadd(whole.at(n).dlq, {"n": str(n)})
    await client.xadd(whole.at(2).review, {"n": "1"})
    assert await waiting(client, whole) == Waiting(reviews=1, dead_letters=PARTITIONS)


async def test_a_scan_reads_every_partition_in_id_order(backend: Backend) -> None:
    client, whole = backend.client, backend.whole
    for n in range(PARTITIONS):
        for m in range(3):
            await client.xadd(whole.at(n).dlq, {"n": f"{n}.{m}"})
    seen = [(part.partition, fields["n"]) async for part, _, fields in
            scan_partitions(client, whole, lambda part: part.dlq)]
    assert seen == [(n, f"{n}.{m}") for n in range(PARTITIONS) for m in range(3)]
    firsts = [(part.partition, fields["n"]) async for part, _, fields in
              scan_partitions(client, whole, lambda part: part.dlq, count=1)]
    assert firsts == [(n, f"{n}.0") for n in range(PARTITIONS)]


async def test_entries_appended_together_are_read_back_by_reference(backend: Backend) -> None:
    client, keys = backend.client, backend.keys
    streams = [keys.stream("a"), keys.stream("b")]
    ids = await append_entries(client, [(streams[0], {"x": "1"}), (streams[1], {"x": "2"})])
    found = await read_entries(client, [(streams[0], ids[0]), (streams[1], ids[1]),
                                        (streams[1], "1-1"), (streams[0], "not an id")])
    assert found == [{"x": "1"}, {"x": "2"}, None, None]
    assert await last_ids(client, [*streams, keys.stream("never")]) == {
        streams[0]: ids[0], streams[1]: ids[1], keys.stream("never"): "0-0"}


async def test_the_run_index_counts_and_forgets_runs_of_every_partition(backend: Backend) -> None:
    index = RunIndex(backend.whole)
    reads = RunIndexReader(index.keys)
    channel = DirectChannel(backend.client)
    runs = [f"run-{n}" for n in range(12)]
    long_ago = now_ms() - 3600_000
    try:
        await channel.transactions([
            [("MULTI",), *index.within(backend.whole.of(run)).writes(
                [RunMark(run, True, "succeeded")], long_ago), ("EXEC",)]
            for run in runs])
        assert len({backend.whole.of(run).partition for run in runs}) == PARTITIONS
        assert (await reads.summary(backend.client))["runs"] == len(runs)
        assert await reads.forget_ended(backend.client, retention_s=60) == len(runs)
        assert (await reads.summary(backend.client))["runs"] == 0
    finally:
        await channel.close()
