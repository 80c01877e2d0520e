"""Two OS processes on one consumer group: shares, kill -9, hand-back on SIGTERM."""

from __future__ import annotations

import signal
import time

import redis

from printery.servers.process import ServerProcess
from printery.testing import wait_for_sync
from printery.wire.keys import StreamKeys
from support.relay_proc import Relays
from support.spine import CODEC


def publish(r: redis.Redis, keys: StreamKeys, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(keys.stream("in"), CODEC.encode(CODEC.new("in", {"n": i}, correlation_id=f"c{i}", producer="t")))
    pipe.execute()


def outputs(r: redis.Redis, keys: StreamKeys) -> tuple[dict[int, int], dict[str, int]]:
    per_n: dict[int, int] = {}
    per_pid: dict[str, int] = {}
    for _id, fields in r.xrange(keys.stream("out")):
        n = int(CODEC.decode(fields, "out").data["n"])
        per_n[n] = per_n.get(n, 0) + 1
        per_pid[fields["by"]] = per_pid.get(fields["by"], 0) + 1
    return per_n, per_pid


def test_two_processes_share_2000_entries_exactly_once(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    for _ in range(2):
        relays.start(prefix, "--delay", "0.002")
    publish(r, keys, 2000)
    wait_for_sync(lambda: r.xlen(keys.stream("out")) >= 2000, timeout=60)
    per_n, per_pid = outputs(r, keys)
    assert per_n == {i: 1 for i in range(2000)}
    assert len(per_pid) == 2 and min(per_pid.values()) > 0, per_pid
    print(f"shares: {per_pid}")


def test_kill_9_survivor_claims_in_flight(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    victim = relays.start(prefix, "--delay", "0.05", "--visibility", "1")
    relays.start(prefix, "--delay", "0.002", "--visibility", "1")  # the survivor
    publish(r, keys, 2000)
    # Wait until the victim holds entries in flight, then kill it without warning.
    def victim_holds() -> bool:
        consumers = r.xinfo_consumers(keys.stream("in"), "w")
        return any(c["pending"] > 0 and f":{victim.pid}:" in c["name"] for c in consumers)

    wait_for_sync(victim_holds, timeout=20)
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait(10)
    wait_for_sync(lambda: r.xlen(keys.stream("out")) >= 2000, timeout=60)
    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 0, timeout=20)
    per_n, _ = outputs(r, keys)
    assert per_n == {i: 1 for i in range(2000)}, "each entry's output written exactly once"


def test_sigterm_hands_prefetched_entries_back_at_once(
    server: ServerProcess, prefix: str, relays: Relays
) -> None:
    """Entries read but not started are claimable by the other process well before the
    visibility timeout (30 s here)."""
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    holder = relays.start(prefix, "--delay", "0.5", "--visibility", "30",
                          "--prefetch", "20", "--parallel", "1", "--drain", "5")
    publish(r, keys, 20)
    wait_for_sync(lambda: r.xpending(keys.stream("in"), "w")["pending"] == 20, timeout=10)
    other = relays.start(prefix, "--visibility", "30")
    begun = time.monotonic()
    holder.popen.send_signal(signal.SIGTERM)
    assert holder.popen.wait(15) == 0
    wait_for_sync(lambda: r.xlen(keys.stream("out")) >= 20, timeout=15)
    elapsed = time.monotonic() - begun
    per_n, per_pid = outputs(r, keys)
    assert per_n == {i: 1 for i in range(20)}
    assert per_pid.get(str(other.pid), 0) >= 15, per_pid
    assert elapsed < 15, "handed back, not waited out the 30 s visibility timeout"
