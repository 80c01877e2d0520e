"""Backpressure and memory (issue 6 item 6): with 100,000 entries waiting in the ingress
stream, a worker process holds at most ``prefetch`` entries per consumer and its resident
memory stays bounded (the figure is printed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from printery.servers.process import ServerProcess
from printery.wire.keys import StreamKeys
from support.relay_proc import Relays
from support.spine import CODEC

ENTRIES = 100_000
PREFETCH = 32


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_100k_waiting_entries_bounded_in_flight_and_memory(
    server: ServerProcess, prefix: str, relays: Relays, report_figures: Callable[[str], None]
) -> None:
    keys = StreamKeys(prefix)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    proc = relays.start(prefix, "--delay", "0.01", "--prefetch", str(PREFETCH),
                        "--parallel", "8", "--visibility", "30")
    idle_rss = rss_kib(proc.pid)
    body = CODEC.encode(CODEC.new("in", {"n": 0, "pad": "x" * 200}, producer="t"))
    for start in range(0, ENTRIES, 5000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, start + 5000):
            pipe.xadd(keys.stream("in"), {**body, "idempotency_key": f"in:{i}"})
        pipe.execute()
    assert r.xlen(keys.stream("in")) == ENTRIES

    peak_rss, peak_pending, samples = 0, 0, 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        for consumer in r.xinfo_consumers(keys.stream("in"), "w"):
            peak_pending = max(peak_pending, int(consumer["pending"]))
        peak_rss = max(peak_rss, rss_kib(proc.pid))
        samples += 1
        time.sleep(0.2)
    group = r.xinfo_groups(keys.stream("in"))[0]
    processed = r.xlen(keys.stream("out"))
    waiting = int(group.get("lag") or 0)
    report_figures(f"{ENTRIES} entries waiting; after 6 s processed {processed}, "
                   f"still waiting {waiting}; peak in flight per consumer {peak_pending} "
                   f"(prefetch {PREFETCH}); RSS idle {idle_rss // 1024} MiB, "
                   f"peak {peak_rss // 1024} MiB ({samples} samples)")
    assert processed > 0 and waiting > ENTRIES // 2, "most entries still wait in the stream"
    assert peak_pending <= PREFETCH, "in-flight work per consumer is bounded by prefetch"
    assert peak_rss - idle_rss < 64 * 1024, "memory does not grow with the backlog"
