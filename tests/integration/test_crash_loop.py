"""Crash loops (issue 6 item 3): an entry whose handler kills the whole process goes to
``dlq`` after ``max_deliveries``, counted from Redis's delivery count (the dying process
never gets to write anything), and the entries behind it are still processed.

A death counts only against an entry that ran alone in its process (reference: failures,
a crash blames the crasher): the first, while nothing said the poison ran alone, makes it
a suspect and is not counted; each later one, as it runs alone, is. So the poison kills
``max_deliveries + 1`` processes."""

from __future__ import annotations

import time

import redis

from printery.servers.process import ServerProcess
from printery.testing import wait_for_sync
from printery.wire.keys import StreamKeys
from support.relay_proc import Relays
from support.spine import CODEC

MAX_DELIVERIES = 3
OK_ENTRIES = 5


def test_process_killing_entry_is_dead_lettered_after_max_deliveries(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    poison = CODEC.new("in", {"n": 0, "crash": True}, correlation_id="poison", producer="t")
    poison_id = r.xadd(keys.stream("in"), CODEC.encode(poison))
    for i in range(1, OK_ENTRIES + 1):
        envelope = CODEC.new("in", {"n": i}, correlation_id=f"c{i}", producer="t")
        r.xadd(keys.stream("in"), CODEC.encode(envelope))

    def settled() -> bool:
        return r.xlen(keys.dlq) >= 1 and r.xlen(keys.stream("out")) >= OK_ENTRIES

    # The supervisor's role: restart the process whenever it dies (bounded).
    crashes = 0
    deadline = time.monotonic() + 60
    while not settled():
        assert time.monotonic() < deadline, "crash loop did not settle"
        assert crashes <= MAX_DELIVERIES + 3, f"too many crashes: {crashes}"
        proc = relays.start(
            prefix, "--visibility", "1", "--prefetch", "1",
            "--max-deliveries", str(MAX_DELIVERIES), ready=False,
        )
        wait_for_sync(
            lambda p=proc: p.popen.poll() is not None or settled(),  # type: ignore[misc]
            timeout=20, message="a crash or the end",
        )
        if proc.popen.poll() is not None:
            assert proc.popen.returncode == 1
            crashes += 1

    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 0, timeout=10)
    (_, dead), = r.xrange(keys.dlq)
    assert dead["source_id"] == poison_id and dead["source_stream"] == keys.stream("in")
    assert dead["reason_code"] == "max_deliveries_exceeded"
    assert int(dead["deliveries"]) >= MAX_DELIVERIES
    assert crashes == MAX_DELIVERIES + 1, "the handler crashed once, then max_deliveries times alone"
    poison_runs = sum(p.starts().count(0) for p in relays.started)
    assert poison_runs == MAX_DELIVERIES + 1
    outs = sorted(int(CODEC.decode(f, "out").data["n"]) for _, f in r.xrange(keys.stream("out")))
    assert outs == list(range(1, OK_ENTRIES + 1)), "later entries processed, exactly once"
    print(f"crashes: {crashes}, dlq deliveries: {dead['deliveries']}, processed: {len(outs)}")


def test_a_process_killing_entry_settles_without_waiting_out_the_visibility_timeout(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    """Before: `os._exit` poison took 5 crashes x the visibility timeout to reach the
    dlq. A process that starts claims at once what a dead process of its host held, so
    with a visibility timeout of 60 s the poison settles within a restart per delivery
    (the wait below is bounded far under one visibility timeout)."""
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    poison = CODEC.new("in", {"n": 0, "crash": True}, correlation_id="poison", producer="t")
    r.xadd(keys.stream("in"), CODEC.encode(poison))
    crashes = 0
    while not r.xlen(keys.dlq):
        assert crashes <= MAX_DELIVERIES + 1, f"too many crashes: {crashes}"
        proc = relays.start(prefix, "--visibility", "60", "--prefetch", "1",
                            "--max-deliveries", str(MAX_DELIVERIES), ready=False)
        wait_for_sync(lambda p=proc: p.popen.poll() is not None or r.xlen(keys.dlq) > 0,  # type: ignore[misc]
                      timeout=20, message="a crash or the dead letter")
        if proc.popen.poll() is not None:
            crashes += 1
    assert crashes == MAX_DELIVERIES + 1
    (_, dead), = r.xrange(keys.dlq)
    assert dead["reason_code"] == "max_deliveries_exceeded"
    assert "died or was killed" in dead["error"]
    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 0, timeout=10)
