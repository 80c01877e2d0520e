"""What the ``WAIT`` after a submit costs (issue 31, docs/performance-history.md): submits per
second with 100 in flight and the latency of one submit at a time, with the wait
(``[transport] submit_wait = 1``) and without it (0), on one server with a replica and
on a 3-master + 3-replica Valkey cluster with nine partitions, all on loopback.

    python -m tests.chaos.submit_wait [--submits 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.cluster import ValkeyCluster

from printery import Output
from printery.pipeline.dag import Pipeline
from printery.runs.facade import Runs
from printery.servers.process import ServerProcess
from printery.transport.connection import connect
from printery.wire.envelope import DEFAULT_PAYLOAD_LIMIT
from printery.wire.keys import StreamKeys

IN_FLIGHT = 100


def _pipeline() -> Pipeline:
    pipeline = Pipeline("wait-bench", ingress=["in"])

    @pipeline.step("s", consumes=["in"], produces=["out"])
    async def step(message: object) -> Output:
        return Output("out", {})

    return pipeline


async def _measure(url: str, partitions: int, submits: int, wait: float) -> dict[str, float]:
    client = connect(url)
    runs = Runs(client, StreamKeys(f"wb:{uuid.uuid4().hex[:8]}", partitions), _pipeline(),
                payload_limit=DEFAULT_PAYLOAD_LIMIT, replicated=wait)
    pad = "x" * 200
    try:
        await runs.submit({"warm": pad})

        async def submitter(first: int) -> None:
            for n in range(first, submits, IN_FLIGHT):
                await runs.submit({"n": n, "pad": pad})

        began = time.perf_counter()
        await asyncio.gather(*(submitter(i) for i in range(IN_FLIGHT)))
        rate = submits / (time.perf_counter() - began)
        latencies = []
        for n in range(300):
            one = time.perf_counter()
            await runs.submit({"one": n, "pad": pad})
            latencies.append((time.perf_counter() - one) * 1000)
        latencies.sort()
        return {"per_s": rate, "p50_ms": statistics.median(latencies),
                "p99_ms": latencies[int(len(latencies) * 0.99) - 1]}
    finally:
        await runs.close()
        await client.aclose()


async def _rounds(label: str, url: str, partitions: int, submits: int, rounds: int) -> None:
    for wait in (0.0, 1.0):
        got: list[dict[str, float]] = [await _measure(url, partitions, submits, wait) for _ in range(rounds)]
        best: dict[str, Any] = {key: (max if key == "per_s" else min)(g[key] for g in got) for key in got[0]}
        print(f"{label}, submit_wait={wait:g}: {best['per_s']:,.0f} submits/s (100 in flight), "
              f"one at a time p50 {best['p50_ms']:.2f} ms, p99 {best['p99_ms']:.2f} ms "
              f"(best of {rounds})")


async def main(submits: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        master = ServerProcess(base / "master")
        master.start()
        replica = ServerProcess(base / "replica", extra_args=["--replicaof", "127.0.0.1", str(master.port)])
        replica.start()
        try:
            client = connect(master.url)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the replica's first sync
                if (await client.info("replication")).get("slave0", {}).get("state") == "online":
                    break
                await asyncio.sleep(0.05)
            await client.aclose()
            await _rounds("one server + replica", master.url, 1, submits, rounds)
        finally:
            replica.stop()
            master.stop()
        cluster = ValkeyCluster(base / "cluster")
        cluster.start()
        try:
            await _rounds("cluster 3+3, 9 partitions", cluster.url, 9, submits, rounds)
        finally:
            cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.submits, args.rounds))
