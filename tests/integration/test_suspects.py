"""The suspects of a process's death (docs/reference.md, Failures: a crash blames the
crasher), against a real server: the entries a consumer of a process that is gone held are
claimed with that delivery not counted and each runs alone, then is cleared; a record saying
one ran alone when its process died counts against that one only; entries a live process
handed back follow no death. The dead process is a real one that exited (its pid gone),
its consumer holding what it read."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import redis.asyncio as aioredis

from printery.base._util import hostname
from printery.runtime.handler import Message, Output
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import CODEC, publish, running, stream_worker


def dead_consumer(group: str) -> str:
    """A consumer name of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return f"{hostname()}:{proc.pid}:{group}:0"


async def held_by(client: aioredis.Redis, keys: StreamKeys, consumer: str, n: int) -> list[str]:
    """``n`` entries of ``in`` published and read by ``consumer`` (its first delivery)."""
    stream = keys.stream("in")
    await client.xgroup_create(stream, "w", id="0", mkstream=True)
    await publish(client, keys, "in", n)
    ((_, entries),) = await client.xreadgroup("w", consumer, {stream: ">"}, count=n)
    return [entry_id for entry_id, _ in entries]


class Calls:
    """A handler that relays ``in`` to ``out`` after a while, noting each call's delivery
    count and when it ran."""

    def __init__(self, delay: float = 0.2) -> None:
        self.delay = delay
        self.ran: list[tuple[int, int, float, float]] = []

    async def made(self, count: int) -> bool:
        return len(self.ran) >= count

    async def __call__(self, msg: Message) -> Output:
        began = time.monotonic()
        await asyncio.sleep(self.delay)
        self.ran.append((msg.data["n"], msg.deliveries, began, time.monotonic()))
        return Output("out", msg.data)


async def test_a_dead_process_s_entries_run_alone_uncounted_then_are_cleared(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    await held_by(client, keys, dead_consumer("w"), 3)
    calls = Calls()
    worker = stream_worker("w", client, keys, ["in"], calls, concurrency=4, claim_interval=0.05)
    async with running(worker):
        await publish(client, keys, "in", 3, start=3)  # new entries beside the suspects
        await wait_for(lambda: calls.made(6), timeout=20)
    by_n = {n: (deliveries, began, ended) for n, deliveries, began, ended in calls.ran}
    assert sorted(by_n) == list(range(6)) and len(calls.ran) == 6
    # The death among several counted for none of them.
    assert all(by_n[n][0] == 1 for n in range(3)), calls.ran
    # Each suspect ran alone: no other call of the process overlapped it.
    for n in range(3):
        _, began, ended = by_n[n]
        for other, (_, b, e) in by_n.items():
            if other != n:
                assert e <= began or b >= ended, f"{other} ran beside suspect {n}: {calls.ran}"
    assert await client.keys(f"{prefix}:suspect:*") == [], "cleared once they ran"
    assert await client.xpending(keys.stream("in"), "w") == {
        "pending": 0, "min": None, "max": None, "consumers": []}


async def test_a_death_while_one_ran_alone_counts_against_that_one_only(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    dead = dead_consumer("w")
    killer, beside = await held_by(client, keys, dead, 2)
    # What the dead process left: the first ran alone in it when it died.
    record = f"{prefix}:suspect:w:{keys.stream('in')}:{killer}"  # as the reference names it
    assert record == keys.suspect("w", keys.stream("in"), killer)
    await client.hset(record, mapping={"suspect": "1", "trial": dead})
    calls = Calls(delay=0.0)
    worker = stream_worker("w", client, keys, ["in"], calls, max_deliveries=1, claim_interval=0.05)
    async with running(worker):
        await wait_for(lambda: calls.made(1), timeout=20)
        await wait_for(lambda: client.xlen(keys.dlq), timeout=20)
    assert [(n, deliveries) for n, deliveries, _, _ in calls.ran] == [(1, 1)]
    ((_, letter),) = await client.xrange(keys.dlq)
    assert letter["source_id"] == killer and letter["reason_code"] == "max_deliveries_exceeded"
    assert "died or was killed each time it ran alone" in letter["error"]
    assert [CODEC.decode(f, "out").data["n"] for _, f in await client.xrange(keys.stream("out"))] == [1]
    assert beside not in {row["message_id"] for row in await client.xpending_range(
        keys.stream("in"), "w", min="-", max="+", count=10)}


async def test_entries_a_live_process_handed_back_follow_no_death(
    client: aioredis.Redis, prefix: str
) -> None:
    keys = StreamKeys(prefix)
    await client.xgroup_create(keys.stream("in"), "w", id="0", mkstream=True)
    started = asyncio.Event()

    async def stuck(msg: Message) -> Output:
        started.set()
        await asyncio.sleep(3600)  # cancelled by the stop's drain, then handed back
        return Output("out", msg.data)

    first = stream_worker("w", client, keys, ["in"], stuck, visibility_timeout=1.0)
    async with running(first):
        await publish(client, keys, "in", 2)
        await asyncio.wait_for(started.wait(), 10)
    records = await client.keys(f"{prefix}:suspect:*")
    assert len(records) == 2
    assert [await client.hgetall(key) for key in records] == [{"handed": "1"}] * 2
    calls = Calls(delay=0.0)
    second = stream_worker("w", client, keys, ["in"], calls, visibility_timeout=1.0,
                           claim_interval=0.05)
    async with running(second):
        await wait_for(lambda: calls.made(2), timeout=20)
    # Counted as deliveries (a hand-back is one), and no suspects: nothing ran alone.
    assert sorted((n, deliveries) for n, deliveries, _, _ in calls.ran) == [(0, 2), (1, 2)]
    assert await client.keys(f"{prefix}:suspect:*") == []
