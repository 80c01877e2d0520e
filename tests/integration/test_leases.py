"""Leases and fencing across OS processes (issue 6 item 2).

A live handler keeps its entry however long it runs (the lease loop renews its idle
time); a consumer that was presumed dead (SIGSTOP) and comes back cannot commit the
entries that were reclaimed from it meanwhile (the commit script checks ownership).
"""

from __future__ import annotations

import signal

import redis

from printery.servers.process import ServerProcess
from printery.testing import wait_for_sync
from printery.wire.keys import StreamKeys
from support.relay_proc import Relays
from support.spine import CODEC


def publish(r: redis.Redis, keys: StreamKeys, n: int) -> None:
    for i in range(n):
        envelope = CODEC.new("in", {"n": i}, correlation_id=f"c{i}", producer="t")
        r.xadd(keys.stream("in"), CODEC.encode(envelope))


def outputs(r: redis.Redis, keys: StreamKeys) -> list[tuple[int, str]]:
    return [
        (int(CODEC.decode(fields, "out").data["n"]), fields["by"])
        for _id, fields in r.xrange(keys.stream("out"))
    ]


def owners(r: redis.Redis, keys: StreamKeys) -> list[str]:
    rows = r.xpending_range(keys.stream("in"), "w", min="-", max="+", count=100)
    return [row["consumer"] for row in rows]


def test_handler_sleeping_past_visibility_keeps_its_entries(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    """Handlers run 3.5 s against a 1 s visibility timeout, with a second process (and each
    process's own claim loop) looking for idle entries every 0.1 s: nothing is claimed."""
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    procs = [relays.start(prefix, "--delay", "3.5", "--visibility", "1") for _ in range(2)]
    publish(r, keys, 6)
    wait_for_sync(lambda: r.xlen(keys.stream("out")) >= 6, timeout=20, message="outputs")
    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 0, timeout=10)
    starts = sorted(n for p in procs for n in p.starts())
    assert starts == list(range(6)), "each handler ran once: no second delivery"
    assert sorted(n for n, _ in outputs(r, keys)) == list(range(6)), "one output each"
    for p in procs:
        assert "claimed idle entries" not in p.stderr()


def test_paused_process_cannot_commit_reclaimed_entries(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    """A is SIGSTOPped mid-handler; B claims its entries after the 1 s visibility timeout;
    A resumes (SIGCONT) and finishes its handlers while B still runs its own: A's commits
    are fenced out, B's go through, each entry's output is written exactly once, by B."""
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    n = 3  # B runs what it took as suspects, one at a time: 4 s each
    paused = relays.start(prefix, "--delay", "2", "--visibility", "1")
    publish(r, keys, n)
    wait_for_sync(lambda: len(paused.starts()) == n, timeout=10, message="A started all")
    paused.popen.send_signal(signal.SIGSTOP)

    taker = relays.start(prefix, "--delay", "4", "--visibility", "1")
    tag = f":{taker.pid}:"
    wait_for_sync(
        lambda: (o := owners(r, keys)) and len(o) == n and all(tag in c for c in o),
        timeout=15, message="B owns every entry",
    )
    assert r.xlen(keys.stream("out")) == 0
    paused.popen.send_signal(signal.SIGCONT)
    # A's handlers are past their 2 s sleep: they finish at once and try to commit,
    # while B (4 s handlers) still holds the entries.
    wait_for_sync(
        lambda: paused.stderr().count("reclaimed by another consumer") == n,
        timeout=10, message="A fenced out of every entry",
    )
    assert r.xlen(keys.stream("out")) == 0, "nothing written by the fenced consumer"
    # What B took from a process that looked dead are suspects: one at a time (4 s each;
    # docs/reference.md, Failures: a crash blames the crasher).
    wait_for_sync(lambda: r.xlen(keys.stream("out")) >= n, timeout=40, message="B's outputs")
    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 0, timeout=10)
    written = outputs(r, keys)
    assert sorted(i for i, _ in written) == list(range(n)), "each output exactly once"
    assert {by for _, by in written} == {str(taker.pid)}
    assert paused.popen.poll() is None, "the resumed process is alive and well"
