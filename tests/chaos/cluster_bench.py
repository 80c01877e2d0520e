"""``printery bench`` on a cluster before and after a master failover (issue 31,
docs/performance-history.md): a fresh 3-master + 3-replica Valkey cluster (tests/support/cluster.py),
the bench with nine partitions in rate mode; then kill -9 of the master holding most
partitions, the bench again once its replica is promoted (the old master still down: the
promoted one has no replica to feed); then the killed node started again (it rejoins as
a replica), and the bench a third time. Each bench is the real command (``printery bench
--redis-url redis+cluster://... --rate R --json``), in a process of its own, so nothing
of one bench's client survives into the next.

    python -m tests.chaos.cluster_bench [--rate 1500] [--duration 10] [--rounds 2]
        [--node-timeout-ms 5000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.cluster import ValkeyCluster

PARTITIONS = 9


def _bench(url: str, rate: float, duration: float, rounds: int) -> dict[str, Any]:
    args = [sys.executable, "-m", "printery.cli.operator", "bench", "--redis-url", url,
            "--rate", str(rate), "--duration", str(duration), "--stages", "4",
            "--partitions", str(PARTITIONS), "--ceiling", "same", "--rounds", str(rounds),
            "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():  # 1: not verified exactly once
        raise RuntimeError(f"bench exited {done.returncode}: {done.stderr[-2000:]}")
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def _line(label: str, doc: dict[str, Any]) -> str:
    ours, ceiling = doc["printery"], doc["ceiling"]
    rates = [r["events_per_s"]["printery"] for r in doc.get("per_round", [])]
    return (f"{label}: printery {ours['events_per_s']:,.0f} ev/s (rounds: "
            f"{', '.join(f'{r:,.0f}' for r in rates) or '-'}), ceiling {ceiling['events_per_s']:,.0f} "
            f"ev/s, ratio {doc['ratio']:.2f}, p50 {ours['p50_ms']:.1f} ms, p99 {ours['p99_ms']:.1f} ms "
            f"(ceiling p99 {ceiling['p99_ms']:.1f} ms), "
            f"server CPU {ours.get('server_cpu_s_per_1000', 0):.3f} ms/event, "
            f"arrived {ours['arrived']} of {doc['events']}, verified {doc['verified']}")


def main(rate: float, duration: float, rounds: int, node_timeout_ms: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        cluster = ValkeyCluster(Path(tmp) / "cluster", node_timeout_ms=node_timeout_ms)
        cluster.start()
        try:
            # Every partition's keys share the hash tag {p<k>} whatever the bench's prefix.
            held = cluster.partition_masters([f"{{p{k}}}" for k in range(PARTITIONS)])
            port = max(held, key=lambda p: len(held[p]))
            victim = next(node for node in cluster.nodes if node.port == port)
            print(f"partitions per master: {sorted(len(keys) for keys in held.values())}; "
                  f"victim {victim.address} holds {len(held[port])}", flush=True)
            before = _bench(cluster.url, rate, duration, rounds)
            print(_line("before the failover", before), flush=True)
            killed = time.monotonic()
            promoted = cluster.kill_master(victim)
            print(f"kill -9 of {victim.address}: {promoted.address} promoted after "
                  f"{time.monotonic() - killed:.1f}s", flush=True)
            after = _bench(cluster.url, rate, duration, rounds)
            print(_line("after the failover (old master down)", after), flush=True)
            cluster.rejoin(victim)
            print(f"{victim.address} back as a replica after {time.monotonic() - killed:.1f}s",
                  flush=True)
            rejoined = _bench(cluster.url, rate, duration, rounds)
            print(_line("after its return as a replica", rejoined), flush=True)
            for label, doc in (("after", after), ("rejoined", rejoined)):
                print(f"{label} / before: printery "
                      f"{doc['printery']['events_per_s'] / before['printery']['events_per_s']:.2f}, "
                      f"ratio {doc['ratio'] / before['ratio']:.2f}", flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Rate mode: in backlog mode (--events) printery's first stage stops after a few
    # hundred events of a 10,000 backlog with several partitions on this build, before
    # any failover (on one server too with nine partitions).
    parser.add_argument("--rate", type=float, default=1500.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--node-timeout-ms", type=int, default=5000)
    args = parser.parse_args()
    main(args.rate, args.duration, args.rounds, args.node_timeout_ms)
